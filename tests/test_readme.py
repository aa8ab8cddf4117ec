"""Every shell block of README.md does what it says.

The blocks are read from the README itself. Each one is run here as written (in a folder with
the checkout's ``.venv`` and ``models``; the only change is that the ports 8000 and 6379 become
free ones, so the test never meets another server), or, where it cannot run in a test (it
trains for hours, builds Docker images: there is no Docker engine here, or it is `make test`
itself), it names the tests that do what it says, and this file checks they exist. A block
added to or changed in the README without an entry in ``PROOF`` fails
``test_every_block_has_its_proof``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nightjar.options import BUNDLED_MODEL
from tests.e2e.conftest import free_port
from tests.up_process import ROOT, Up

README = ROOT / "README.md"


def shell_blocks(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"```sh\n(.*?)```", text, re.S)]


BLOCKS = shell_blocks(README.read_text())

# The first line of each README shell block -> the tests that prove it ("file::function").
PROOF: dict[str, list[str]] = {
    "make run    # create .venv, install, serve SmolLM2-135M-Instruct at http://127.0.0.1:8000": [
        "tests/test_readme.py::test_make_run_is_nightjar_up_and_make_test_runs_pytest",
        "tests/nightjar/test_up.py::test_up_serves_smollm2_with_its_heads_by_default",
        "tests/nightjar/test_up.py::test_ready_line_top_and_the_cached_profile",
    ],
    "curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\": [
        "tests/test_readme.py::test_the_try_it_block_runs",
    ],
    "source .venv/bin/activate                 # nightjar on the PATH (make run / make install made .venv)": [
        "tests/test_readme.py::test_the_services_separately_block_runs",
    ],
    # No Docker engine here: the compose file and the build argument are checked statically.
    'docker compose build --build-arg PIP_TORCH_ARGS="--index-url <PyTorch\'s CPU wheel index>"': [
        "tests/chaos/test_compose.py::test_service_commands_parse",
        "tests/chaos/test_compose.py::test_dockerfile_installs_every_package",
        "tests/test_readme.py::test_the_compose_block_names_what_exists",
    ],
    "source .venv/bin/activate": [
        "tests/training/test_pipeline.py::test_mini_target_learns_and_saves_a_loadable_hf_dir",
        "tests/training/test_smollm2.py::test_a_complete_export_is_left_alone",  # make test exports it
        "tests/worker/engine/test_real_models.py::test_smollm2_gguf_loads_through_transformers_and_generates_the_same",
        "tests/training/test_smol_pipeline.py::test_train_smol_drafters_end_to_end",
        "tests/nightjar/test_up.py::test_ready_line_top_and_the_cached_profile",
        "tests/benchmarks/load/test_runner.py::test_smoke_run_writes_every_output",
    ],
}


def _defined(node_id: str) -> bool:
    path, _, name = node_id.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(tree))


def test_every_block_has_its_proof() -> None:
    firsts = [b.splitlines()[0] for b in BLOCKS]
    assert len(firsts) == len(BLOCKS) == 5, firsts
    for first in firsts:
        assert first in PROOF, f"README block without a test: {first!r}"
        missing = [t for t in PROOF[first] if not _defined(t)]
        assert not missing, (first, missing)


def test_make_run_is_nightjar_up_and_make_test_runs_pytest() -> None:
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    dry = ["make", "-n", "--no-print-directory"]  # under `make test` a nested make prints directory lines
    run = subprocess.run([*dry, "run"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == ".venv/bin/nightjar up"
    test = subprocess.run([*dry, "test"], capture_output=True, text=True, cwd=ROOT)
    assert ".venv/bin/pytest" in test.stdout


def test_the_compose_block_names_what_exists() -> None:
    (block,) = [b for b in BLOCKS if b.startswith("docker compose")]
    assert "ARG PIP_TORCH_ARGS" in (ROOT / "Dockerfile").read_text()
    assert "${NIGHTJAR_WORKERS:-2}" in (ROOT / "compose.yaml").read_text()
    assert "NIGHTJAR_WORKERS=2 docker compose up" in block


def _folder(tmp: Path) -> Path:
    """A folder like a checkout after `make install`: .venv (this interpreter's) and models."""
    work = tmp / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(Path(sys.prefix))
    (work / "models").symlink_to(ROOT / "models")
    if not (work / ".venv" / "bin" / "activate").is_file():
        pytest.fail(f"{sys.prefix} is not a virtual environment (make install creates .venv)")
    return work


def _env(cache: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NIGHTJAR_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
    for name in ("NIGHTJAR_REDIS_URL", "NIGHTJAR_URL", "NIGHTJAR_API_KEYS", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


@pytest.mark.slow
def test_the_try_it_block_runs(tmp_path: Path) -> None:
    (block,) = [b for b in BLOCKS if b.startswith("curl")]
    cache = tmp_path / "cache"
    up = Up(tmp_path, cache, "--model", str(BUNDLED_MODEL), "--no-profile")
    try:
        up.wait_for("ready: ", 180)
        script = block.replace("localhost:8000", f"localhost:{up.port}")
        env = {**_env(cache), "NIGHTJAR_URL": f"http://127.0.0.1:{up.port}"}
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            capture_output=True, text=True, timeout=300, cwd=_folder(tmp_path), env=env,
        )  # fmt: skip
    finally:
        assert up.stop() == 0
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.count('"chat.completion"') == 1 and out.count('"text_completion"') == 1, out
    assert "data: [DONE]" in out  # the streamed chat
    assert "nj-target" in out and "policy nightjar" in out  # `nightjar top --once` found the running up


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_the_services_separately_block_runs(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on the PATH (.ci/run installs it)")
    (block,) = [b for b in BLOCKS if "redis-server" in b]
    redis_port, http_port = free_port(), free_port()
    script = block.replace("6379", str(redis_port)).replace("8000", str(http_port))
    # The worker's cost profile within 5 s: the block is about starting the services.
    env = {**_env(tmp_path / "cache"), "NIGHTJAR_PROFILE_BUDGET_S": "5"}
    log = tmp_path / "services.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script], stdout=out, stderr=subprocess.STDOUT,
            cwd=_folder(tmp_path), env=env, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{http_port}"
    try:
        assert proc.wait(timeout=120) == 0, log.read_text()  # every line ran; the services run on
        assert "asked the planner to use nightjar" in log.read_text()
        deadline = time.monotonic() + 240
        ready: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                resp = httpx.get(base + "/health/ready", timeout=5)
                ready = resp.json()
                if resp.status_code == 200 and ready["planner"]["policy"] == "nightjar":  # type: ignore[index]
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(f"not ready with policy nightjar: {ready}\n{log.read_text()[-4000:]}")
        assert ready["models"] == ["nj-target"]
        assert httpx.get(base + "/v1/models", timeout=5).status_code == 401  # --api-key "$KEY" closed it
        deadline = time.monotonic() + 30
        while f"ready: http://127.0.0.1:{http_port} model=nj-target" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        assert (tmp_path / "checkout" / "var" / "redis" / "appendonlydir").is_dir()  # persistence on
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not _group_gone(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _group_gone(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
