#!/usr/bin/env bash
# The dynamic-load benchmark on one GPU (an H200) in under 8 minutes. Prepared; run it from
# the repository root on the GPU machine:
#
#   bash benchmarks/gpu/prepare_bench.sh   # HERE first (PyPI): wheels -> .whl/, workload -> .bench-data/
#   (on the GPU machine, carrying .whl and .bench-data)  bash benchmarks/gpu/run_bench.sh
#
# The GPU image has CUDA torch, transformers, numpy, matplotlib, httpx, anyio, msgpack, tqdm,
# but not redis, fakeredis, pydantic, fastapi or uvicorn, and cannot reach PyPI. A venv made
# with --system-site-packages keeps the image's CUDA torch (never install a torch wheel there)
# and gets the missing packages from the carried .whl/ folder.
#
# Models come with the working tree (models/, the bundled target and drafters). Everything
# lands in $OUT (default runs/gpu-bench): report.md, results.json, timeline.png,
# latency_cdf.png, bench.log, and logs.tgz (the services' logs, when they ran as processes).
# Overrides: MODEL, DRAFTER, WORKLOAD, PHASES, MAX_TOKENS,
# ENGINE_OPTS (space-separated key=value), CONFIGS (space-separated NAME=POLICY:k=v), BUDGET_S,
# VENV, REQUIRE_CUDA=0 (a dry run on a CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # the real Triton kernels on the GPU, not the interpreter
OUT="${OUT:-runs/gpu-bench}"
mkdir -p "$OUT"
T0=$(date +%s)

VENV="${VENV:-/tmp/nj-venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import redis, fakeredis, pydantic, fastapi, uvicorn" 2>/dev/null; then
  [ -d .whl ] || { echo "no .whl/ folder: run benchmarks/gpu/prepare_bench.sh first and carry .whl" >&2; exit 2; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
fi
if [ "${REQUIRE_CUDA:-1}" = 1 ]; then  # REQUIRE_CUDA=0: a dry run of this script on a CPU
  "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA'; print(torch.__version__, torch.cuda.get_device_name(0))"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# The services as separate processes on a real Redis when one can run (the carried
# redis-server), so the load client shares no interpreter with the engine; else in-process.
SERVICE_ARGS=(--services inprocess)
REDIS_BIN="$(command -v redis-server || echo .bench-data/redis/redis-server)"
if [ -x "$REDIS_BIN" ] && LD_LIBRARY_PATH=.bench-data/redis "$REDIS_BIN" --port 6390 --bind 127.0.0.1 \
    --daemonize yes --save "" --appendonly no >/dev/null 2>&1; then
  for _ in $(seq 50); do
    "$PY" -c "import redis; redis.Redis(port=6390).ping()" 2>/dev/null && break; sleep 0.1
  done
  "$PY" -c "import redis; redis.Redis(port=6390).ping()" 2>/dev/null \
    && SERVICE_ARGS=(--services processes --redis-url redis://127.0.0.1:6390/0)
fi
echo "services: ${SERVICE_ARGS[*]}"

MODEL="${MODEL:-models/nj-target}"
DRAFTER="${DRAFTER:-models/nj-draft-prose}"
WORKLOAD="${WORKLOAD:-.bench-data/spec_bench_question.jsonl}"
# About 45 s of load per configuration; with start-up, warm-up and drain about 70 s each, so
# six configurations, the baseline and the set-up fit in 8 minutes. BUDGET_S stops early if not.
PHASES="${PHASES:-low:2:10,high:24:25,low:2:10}"
MAX_TOKENS="${MAX_TOKENS:-64}"
BUDGET_S="${BUDGET_S:-$((450 - $(date +%s) + T0))}"
ENGINE_ARGS=()
for opt in ${ENGINE_OPTS-device=cuda}; do ENGINE_ARGS+=(--engine-opt "$opt"); done
CONFIG_ARGS=()
for cfg in ${CONFIGS:-}; do CONFIG_ARGS+=(--config "$cfg"); done
DRAFTER_ARGS=()
[ -f "$DRAFTER/config.json" ] && DRAFTER_ARGS=(--drafter "$DRAFTER")

set -o pipefail
"$PY" -m benchmarks.load "$WORKLOAD" --model "$MODEL" --phases "$PHASES" --seed 0 \
  --max-tokens "$MAX_TOKENS" --max-prompt-tokens 512 --max-jobs 64 --warmup 8 \
  --drain-timeout 15 --time-budget "$BUDGET_S" --hf-batch-size 16 --hf-requests 64 --hf-assisted 8 \
  "${SERVICE_ARGS[@]}" "${ENGINE_ARGS[@]}" "${CONFIG_ARGS[@]}" "${DRAFTER_ARGS[@]}" --out "$OUT" \
  --no-progress 2>&1 | tee "$OUT/bench.log"
"$PY" -c "import redis; redis.Redis(port=6390).shutdown(nosave=True)" 2>/dev/null || true
# At most 8 files come back from $OUT: the per-service logs travel as one archive.
if [ -d "$OUT/logs" ]; then tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"; fi
echo "done in $(( $(date +%s) - T0 )) s; results in $OUT"
