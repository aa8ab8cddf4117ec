"""End-to-end smoke run: two configurations against the in-process trio with a tiny random
Llama, a few seconds of phased load, the transformers baseline, and every output file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.load.cli import main
from shared.connection import reset_fake_server
from tests.tiny_models import build_llama

PROMPTS = ["The quick brown fox", "Once upon a time", "Redis streams carry jobs", "Speculative decoding"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench-models")
    return build_llama(root / "target"), build_llama(root / "draft", layers=1, hidden=32, seed=1)


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def test_smoke_run_writes_every_output(models: tuple[Path, Path], workload: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    target, draft = models
    out = tmp_path / "out"
    argv = [
        str(workload), "--model", str(target), "--phases", "low:2:1.5,high:6:1", "--seed", "1",
        "--config", "off=static:gamma=0", "--config", "nightjar=nightjar",
        "--max-tokens", "4", "--warmup", "1", "--warmup-tokens", "2", "--max-jobs", "8",
        "--drain-timeout", "120", "--hf-requests", "2", "--hf-batch-size", "2", "--hf-assisted", "1",
        "--drafter", str(draft), "--no-progress", "--out", str(out),
    ]  # fmt: skip
    try:
        assert main(argv) == 0
    finally:
        reset_fake_server()
    printed = capsys.readouterr().out
    assert "verdict (open loop): the claim" in printed
    for name in ("results.json", "report.md", "timeline.png", "latency_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in data["configs"]] == ["off", "nightjar"]
    sent = data["meta"]["requests"]
    assert sent > 0
    for cfg in data["configs"]:
        reqs = cfg["requests"]
        assert len(reqs) == sent
        assert all(r["error"] is None for r in reqs), [r["error"] for r in reqs if r["error"]]
        assert all(r["completion_tokens"] == 4 and r["finish_reason"] == "length" for r in reqs)
        assert [p["label"] for p in cfg["phases"]] == ["low#0", "high#1", "all"]
        whole = cfg["phases"][-1]
        assert whole["completed"] == sent and whole["output_tokens"] == pytest.approx(4 * sent)
        assert cfg["telemetry_steps"] > 0
        assert cfg["timeline"]["decisions"][0]["policy"] == ("static" if cfg["name"] == "off" else "nightjar")
    steps = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    for cfg in data["configs"]:  # every step the report counted is in the dump, under its config
        assert sum(s["config"] == cfg["name"] for s in steps) == cfg["telemetry_steps"]
    assert all("step_time" in s and "gamma" in s and s["t_s"] > -1 for s in steps)
    assert [b["name"] for b in data["baseline"]] == ["hf-generate b=2", "hf-generate b=1", "hf-assisted b=1"]
    assert data["verdict"]["target"] == "nightjar" and data["verdict"]["missing"] is None
    assert data["verdict"]["mode"] == "open" and data["meta"]["loop"] == "open"

    report = (out / "report.md").read_text()
    assert "| off | high#1 |" in report and "| nightjar | all |" in report
    assert "| hf-generate b=2 | offline |" in report
    assert "**Verdict: the claim" in report


def test_bad_input_exits_2(
    models: tuple[Path, Path], workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, _ = models
    assert main([str(workload), "--model", str(target), "--phases", "nope"]) == 2
    assert main([str(workload), "--model", str(target), "--config", "x=static:gamma=99"]) == 2
    assert main([str(workload), "--model", str(target.parent / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("nightjar bench: error:") == 3
    assert main(["--no-such-flag"]) == 2
    assert main(["--help"]) == 0


def test_run_configs_notes_failures_and_the_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.load import runner
    from benchmarks.load.configs import BenchConfig
    from benchmarks.load.phases import parse_phases
    from benchmarks.load.trio import TrioOptions

    ran: list[str] = []

    async def fake_run_config(cfg: BenchConfig, *_: object) -> str:
        ran.append(cfg.name)
        if cfg.name == "broken":
            raise RuntimeError("engine would not load")
        return cfg.name

    monkeypatch.setattr(runner, "run_config", fake_run_config)
    settings = runner.RunSettings(parse_phases("a:1:1"), TrioOptions("unused"))
    configs = [BenchConfig("a", "static"), BenchConfig("broken", "static"), BenchConfig("b", "static")]
    runs, notes = runner.run_configs(configs, [], [], settings)
    assert runs == ["a", "b"]
    assert notes == ["broken: failed: RuntimeError: engine would not load"]

    ran.clear()
    runs, notes = runner.run_configs(configs, [], [], settings, deadline=0.0)
    assert (runs, ran) == ([], [])
    assert [n.split(":")[0] for n in notes] == ["a", "broken", "b"]
