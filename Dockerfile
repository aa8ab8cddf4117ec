# One image for every Nightjar service; compose.yaml picks the command.
FROM python:3.11-slim

WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# A C compiler: on a CPU worker nj_kernels/cpu_linear.py compiles the skinny-GEMM kernel for the
# host it runs on (-march=native) at first use; without one the worker falls back to torch's.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# torch first and alone, so the project's `torch>=2.6` is already met. PyPI's Linux wheel
# is the CUDA build; pass PIP_TORCH_ARGS="--index-url <PyTorch's CPU wheel index>" for CPU.
ARG PIP_TORCH_ARGS=""
RUN pip install torch==2.13.0 $PIP_TORCH_ARGS

COPY pyproject.toml README.md constraints.txt ./
COPY nightjar nightjar
COPY gateway gateway
COPY worker worker
COPY planner planner
COPY shared shared
COPY nj_kernels nj_kernels
COPY training training
COPY benchmarks benchmarks
RUN pip install -c constraints.txt .

EXPOSE 8000
# Each service runs as pid 1 and handles SIGTERM itself: the gateway stops accepting and lets
# open responses end, a worker drains (NIGHTJAR_DRAIN_TIMEOUT_S) and hands back what is left.
# Give the container a stop grace period longer than that (compose.yaml does).
STOPSIGNAL SIGTERM
CMD ["nightjar", "--help"]
