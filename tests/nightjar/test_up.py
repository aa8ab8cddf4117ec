"""`nightjar up` as a user runs it, as its own process: one ready line once it can answer;
`nightjar top` finds its embedded store with no Redis named; the cost profile measured on
the first start is taken from the cache on the second. And, on the real SmolLM2: with no
--model it serves SmolLM2 with both heads and the n-gram drafter, and answers sensibly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nightjar.options import BUNDLED_MODEL, SMOLLM2_MODEL
from tests.up_process import ROOT, Up


def _ready_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ready: ")]


@pytest.mark.slow
def test_ready_line_top_and_the_cached_profile(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ["--model", str(BUNDLED_MODEL), "--profile-budget", "4", "--worker-id", "up-w1"]
    up = Up(tmp_path, cache, *args)
    try:
        text = up.wait_for("ready: ", 180)
        ready = httpx.get(f"http://127.0.0.1:{up.port}/health/ready", timeout=10)
        assert ready.status_code == 200, ready.text  # the line and /health/ready agree
        assert "cost profile of nj-target measured" in text
        (line,) = _ready_lines(text)
        assert line.startswith(f"ready: http://127.0.0.1:{up.port} model=nj-target drafters=")
        assert "ngram" in line and "nj-draft-prose" in line and line.endswith("policy=nightjar")
        (announced,) = (cache / "run").glob("up-*.json")
        assert json.loads(announced.read_text())["pid"] == up.proc.pid
        top = subprocess.run(
            [sys.executable, "-m", "nightjar", "top", "--once"],
            capture_output=True, text=True, timeout=60, env=up.env, cwd=ROOT,
        )  # fmt: skip
        assert top.returncode == 0, top.stderr
        assert "nj-target" in top.stdout and "up-w1" in top.stdout, top.stdout
        assert "policy nightjar" in top.stdout
    finally:
        assert up.stop() == 0
    assert not list((cache / "run").glob("up-*.json"))  # gone with the process
    assert len(_ready_lines(up.text())) == 1
    assert list((cache / "profiles").glob("nj-target-*.json"))

    again = Up(tmp_path, cache, *args)
    try:
        text = again.wait_for("ready: ", 180)
        assert "cost profile of nj-target from the cache" in text
        assert "cost profile of nj-target measured" not in text
    finally:
        assert again.stop() == 0


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2_MODEL / "config.json").is_file(), reason="make test exports SmolLM2 first")
def test_up_serves_smollm2_with_its_heads_by_default(tmp_path: Path) -> None:
    up = Up(tmp_path, tmp_path / "cache", "--no-profile")  # the default model: no --model
    try:
        (line,) = _ready_lines(up.wait_for("ready: ", 300))
        assert "model=smollm2-135m-instruct" in line
        assert "drafters=ngram,smol-eagle-chat,smol-eagle-code" in line
        body = {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 24,
            "temperature": 0,
        }
        resp = httpx.post(f"http://127.0.0.1:{up.port}/v1/chat/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        assert "Paris" in resp.json()["choices"][0]["message"]["content"]
    finally:
        assert up.stop() == 0
