"""The benchmark against the services as separate processes on the real Redis (database 14)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from benchmarks.load.cli import main
from benchmarks.load.configs import BenchConfig
from benchmarks.load.trio import TrioOptions
from benchmarks.load.trio_procs import clear_nightjar_keys, service_commands
from shared.connection import connect
from tests.tiny_models import build_llama

REDIS_URL = "redis://127.0.0.1:6379/14"


@pytest.fixture
async def r() -> AsyncIterator[aioredis.Redis]:
    client = connect(REDIS_URL)
    yield client
    await client.aclose()


def test_service_commands_carry_the_policy_and_engine_options() -> None:
    cfg = BenchConfig("s2", "static", {"gamma": "2"})
    opts = TrioOptions("/m", max_jobs=4, engine={"device": "cuda", "max_num_seqs": 8}, threads=2)
    cmds = service_commands(cfg, opts, REDIS_URL, 8123)
    assert cmds["planner"][-6:] == ["--redis-url", REDIS_URL, "--policy", "static", "--set", "gamma=2"]
    worker = cmds["worker"]
    assert worker[worker.index("--model") + 1] == "/m" and "--threads" in worker
    assert worker[-4:] == ["--engine-opt", "device=cuda", "--engine-opt", "max_num_seqs=8"]
    assert cmds["gateway"][cmds["gateway"].index("--port") + 1] == "8123"
    assert "--no-profile" in worker  # a static configuration never reads the profile
    assert (
        "--no-profile" not in service_commands(BenchConfig("n", "nightjar"), opts, REDIS_URL, 8123)["worker"]
    )


@pytest.mark.redis
@pytest.mark.anyio
async def test_clearing_touches_only_nightjar_keys(r: aioredis.Redis) -> None:
    await r.set("nj:bench-test", b"1")
    await r.set("other:bench-test", b"1")
    try:
        assert await clear_nightjar_keys(r) >= 1
        assert await r.exists("nj:bench-test") == 0
        assert await r.exists("other:bench-test") == 1
    finally:
        await r.delete("other:bench-test")


@pytest.mark.redis
@pytest.mark.slow
def test_smoke_run_with_service_processes(tmp_path: Path) -> None:
    model = build_llama(tmp_path / "target")
    workload = tmp_path / "p.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Once upon a time", "The fox")))
    out = tmp_path / "out"
    argv = [str(workload), "--model", str(model), "--phases", "only:3:2", "--seed", "2", "--max-tokens", "4",
            "--config", "nightjar=nightjar", "--warmup", "1", "--no-hf-baseline", "--no-progress",
            "--services", "processes", "--redis-url", REDIS_URL, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    reqs = data["configs"][0]["requests"]
    assert reqs and all(r["error"] is None and r["completion_tokens"] == 4 for r in reqs)
    assert data["configs"][0]["telemetry_steps"] > 0
    assert data["meta"]["services"] == f"processes on {REDIS_URL}"
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "nightjar-gateway.log", "nightjar-planner.log", "nightjar-worker.log"
    ]  # fmt: skip
