"""The model served when none is named: SmolLM2 (exported first by `up`), else nj-target with
the reason logged. The exporter here is a stand-in: no test depends on SmolLM2 unless marked."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nightjar.default_model import default_model
from nightjar.options import BUNDLED_MODEL
from training.smollm2 import META_FILE, REQUIRED_FILES

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _write_export(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in (*REQUIRED_FILES, META_FILE, GGUF):
        (out / name).write_text("{}")


def _write_fp32_export(out: Path) -> None:
    """An export made before the GGUF file was kept beside it."""
    out.mkdir(parents=True)
    for name in (*REQUIRED_FILES, META_FILE):
        (out / name).write_text("{}")


def _never(out: Path) -> None:
    raise AssertionError("no export expected")


def test_an_export_that_is_there_is_served(tmp_path: Path) -> None:
    out = tmp_path / "smollm2-135m-instruct"
    _write_export(out)
    assert default_model(export=True, out=out, exporter=_never) == out
    assert default_model(export=False, out=out, exporter=_never) == out


def test_up_exports_on_its_first_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "smollm2-135m-instruct"
    with caplog.at_level(logging.INFO, "nightjar"):
        assert default_model(export=True, out=out, exporter=_write_export) == out
    assert "first run: exporting SmolLM2" in caplog.text


def test_a_failed_export_serves_nj_target_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def offline(out: Path) -> None:
        raise OSError("no route to the package index")

    with caplog.at_level(logging.INFO, "nightjar"):
        assert default_model(export=True, out=tmp_path / "s", exporter=offline) == BUNDLED_MODEL
    assert "serving the bundled nj-target: the SmolLM2 export failed (OSError: no route" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, "nightjar"):
        assert default_model(export=True, out=tmp_path / "s", exporter=lambda out: None) == BUNDLED_MODEL
    assert "left no complete model" in caplog.text


def test_a_worker_never_exports(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "nightjar"):
        assert default_model(export=False, out=tmp_path / "s", exporter=_never) == BUNDLED_MODEL
    assert "is not exported" in caplog.text


def test_an_export_without_its_gguf_is_served_or_completed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "smollm2-135m-instruct"
    _write_fp32_export(out)
    with caplog.at_level(logging.INFO, "nightjar"):
        assert default_model(export=False, out=out, exporter=_never) == out  # a worker: the fp32 export
    assert "serving its fp32 export" in caplog.text
    assert default_model(export=True, out=out, exporter=_write_export) == out  # up: adds the file
    assert (out / GGUF).is_file()
    (out / GGUF).unlink()

    def offline(out: Path) -> None:
        raise OSError("no route to the package index")

    assert default_model(export=True, out=out, exporter=offline) == out  # still the fp32 export

