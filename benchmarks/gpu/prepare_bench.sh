#!/usr/bin/env bash
# Run HERE (a machine with PyPI), before benchmarks/gpu/run_bench.sh goes to the GPU machine,
# which reaches no network. It fills two folders that git ignores (.git/info/exclude) and
# that the run carries:
#   .whl/         wheels of the packages the services need that the GPU image lacks (or has
#                 at another version), for its Python 3.12 — never a torch wheel: the GPU
#                 machine has its own CUDA torch;
#   .bench-data/  the workload file (a transient copy for the trip, never committed), and this
#                 machine's redis-server with the two libraries the GPU image may lack, so the
#                 services can run there as separate processes (run_bench.sh falls back to
#                 in-process services if it does not start).
set -euo pipefail
cd "$(dirname "$0")/../.."
for d in /.whl/ /.bench-data/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
WORKLOAD="${WORKLOAD:-../shared/data/workloads/spec_bench_question.jsonl}"
mkdir -p .bench-data && cp "$WORKLOAD" .bench-data/
if command -v redis-server >/dev/null; then
  mkdir -p .bench-data/redis
  cp "$(readlink -f "$(command -v redis-server)")" .bench-data/redis/redis-server
  for lib in $(ldd "$(command -v redis-server)" | awk '/liblzf|libjemalloc/ {print $3}'); do
    cp "$lib" .bench-data/redis/
  done
fi
PACKAGES=(
  redis==8.1.0 fakeredis==2.41.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2
  uvicorn==0.54.0 transformers==5.24.0
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${PACKAGES[@]}"
du -sh .whl .bench-data
