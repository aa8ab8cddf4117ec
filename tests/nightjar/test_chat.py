"""``nightjar chat`` against ``nightjar up`` serving the bundled target with a drafter at
γ = 2: driven by a pipe and by a terminal (a pty), it shows the answers with accepted drafts
and the target's own tokens in their colours, the API's exact text, and a status line per
answer (drafter, γ, acceptance, tok/s); a refused message is one error line, and the session
goes on."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live_gateway import DRAFTER, ROOT, nightjar_up

pytestmark = pytest.mark.slow

ANSI = re.compile(r"\x1b\[[0-9;]*m")
GREEN, BLUE = "\x1b[32m", "\x1b[34m"
STATUS = re.compile(
    r"\[drafter (\S+) · γ (\d+) · acceptance (\d+)% \((\d+)/(\d+)\) · "
    r"([\d.]+) tok/s · (\d+) tokens, (\d+) drafted"
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with nightjar_up(gamma=2, log=tmp_path_factory.mktemp("up") / "nightjar-up.log") as base:
        yield base


def _chat(base: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "nightjar", "chat", "--url", base, "--max-tokens", "48", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def _api_answer(base: str, messages: list[dict[str, str]]) -> str:
    body = {"messages": messages, "max_tokens": 48, "temperature": 0}
    return str(
        httpx.post(base + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"][
            "content"
        ]
    )


def test_piped_messages_are_answered_in_colour_with_a_status_line(live: str) -> None:
    lines = "Tell me a story about a king\nAnd then?\n/new\nOnce upon a time\n"
    got = subprocess.run(
        _chat(live, "--color", "always"), input=lines, capture_output=True, text=True, timeout=300, env=_env()
    )
    assert got.returncode == 0, got.stderr
    assert GREEN in got.stdout and BLUE in got.stdout  # accepted drafts and target tokens
    plain = ANSI.sub("", got.stdout)
    statuses = STATUS.findall(plain)
    assert len(statuses) == 3, plain
    for drafter, gamma, _pct, accepted, proposed, rate, tokens, drafted in statuses:
        assert drafter == DRAFTER.name and int(gamma) in (0, 1, 2)  # γ shrinks at max_tokens' edge
        assert 0 < int(accepted) <= int(proposed) and int(drafted) == int(accepted)
        assert 0 < int(tokens) <= 48 and float(rate) > 0
    # What it shows is the API's answer, token for token (greedy); the second message saw the
    # first exchange, the third (after /new) did not.
    first = _api_answer(live, [{"role": "user", "content": "Tell me a story about a king"}])
    second = _api_answer(
        live,
        [
            {"role": "user", "content": "Tell me a story about a king"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "And then?"},
        ],
    )
    third = _api_answer(live, [{"role": "user", "content": "Once upon a time"}])
    answers = [a.split("\n[drafter ")[0] for a in plain.split("assistant> ")[1:]]
    assert answers == [first, second, third]


def test_without_colour_and_on_a_refusal_one_error_line_and_the_session_goes_on(live: str) -> None:
    got = subprocess.run(
        _chat(live, "--color", "never", "--model", "no-such-model"),
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert got.returncode == 1
    (line,) = got.stderr.strip().splitlines()
    assert line.startswith("nightjar chat: error: 404") and "no-such-model" in line
    assert not ANSI.search(got.stdout)


def test_in_a_terminal_it_prompts_and_colours_by_itself(live: str) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(_chat(live), stdin=slave, stdout=slave, stderr=slave, env=_env(), close_fds=True)
    os.close(slave)
    out = bytearray()
    try:
        _read_until(master, out, b"you> ", 60)
        os.write(master, b"Once upon a time\n")
        _read_until(master, out, b"tok/s", 120)
        _read_until(master, out, b"you> ", 30, after=out.index(b"tok/s"))
        os.write(master, b"/quit\n")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert GREEN in text and BLUE in text
    assert STATUS.search(ANSI.sub("", text).replace("\r", ""))


def _read_until(fd: int, out: bytearray, marker: bytes, timeout_s: float, after: int = 0) -> None:
    """Read the terminal into ``out`` until ``marker`` appears past ``after``."""
    deadline = time.monotonic() + timeout_s
    while out.find(marker, after) < 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {marker!r} within {timeout_s}s; got {bytes(out[-500:])!r}")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            out += os.read(fd, 65536)


def test_the_chat_help_says_every_default() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "nightjar", "chat", "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert got.returncode == 0
    text = " ".join(got.stdout.split())  # argparse wraps the help
    for flag, default in [("--max-tokens", "256"), ("--temperature", "0"), ("--color", "auto")]:
        assert flag in text and f"(default: {default}; env NIGHTJAR_" in text
    assert Path(ROOT / "nightjar" / "chat.py").is_file()
