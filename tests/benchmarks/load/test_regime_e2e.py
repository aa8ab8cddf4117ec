"""A tiny regime workload end to end, in seconds: closed-loop phases whose load and content
change (chat → chat+code → code), the generated line-up against the embedded trio with a tiny
random Llama, and a report with every row — the oracle's too — and a computed verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.load.cli import main
from shared.connection import reset_fake_server
from tests.tiny_models import build_llama


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("regime-model") / "target")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "workloads").mkdir()
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": f"Tell me about fox {i}"}]}
            for i in range(8)]  # fmt: skip
    (tmp_path / "workloads" / "sharegpt_v3_filtered_1000.json").write_text(json.dumps(rows))
    return tmp_path


def test_tiny_regime_run_reports_every_row_the_oracle_and_a_verdict(
    target: Path, data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [
        "--model", str(target), "--data-dir", str(data),
        "--phases", "chat_low:2u:1:chat,mixed_high:4u:1.5:chat+code,code_low:2u:1:code",
        "--lineup", "--drafters", "ngram", "--gammas", "2",
        "--max-tokens", "4", "--max-prompt-tokens", "1200", "--warmup", "1", "--warmup-tokens", "2",
        "--max-jobs", "8", "--drain-timeout", "60", "--no-hf-baseline", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    try:
        assert main(argv) == 0
    finally:
        reset_fake_server()
    printed = capsys.readouterr().out
    assert "verdict (closed loop): the claim" in printed
    assert "no harm: mixed_high#1 vs" in printed and "claim: geomean vs no-spec" in printed

    data_out = json.loads((out / "results.json").read_text())
    names = ["no-spec", "ngram-2", "nightjar"]
    assert [c["name"] for c in data_out["configs"]] == names
    labels = ["chat_low#0", "mixed_high#1", "code_low#2", "all"]
    for cfg in data_out["configs"]:
        assert [p["label"] for p in cfg["phases"]] == labels
        assert all(r["error"] is None for r in cfg["requests"]), [r["error"] for r in cfg["requests"]]
        assert all(p["completed"] > 0 for p in cfg["phases"]), cfg["name"]
        mixed = [r for r in cfg["requests"] if r["window"] == 1]
        assert len(mixed) >= 4  # four users, each at least one request
        # Phases run one after another: each starts once the last one's requests are answered.
        ws = cfg["windows"]
        assert [w[0] for w in ws] == labels[:3]
        for i in (1, 2):
            before = [r["end_s"] for r in cfg["requests"] if r["window"] == i - 1]
            assert ws[i][1] >= max(before) and ws[i][1] >= ws[i - 1][2]
            assert all(r["sent_s"] >= ws[i][1] for r in cfg["requests"] if r["window"] == i)
    meta = data_out["meta"]
    assert meta["loop"] == "closed" and meta["content"]["mixed_high"] == "chat+code"
    assert "not pinned" in meta["pinning"]
    v = data_out["verdict"]
    assert v["mode"] == "closed" and v["missing"] is None and v["answer"] in ("holds", "does not hold")
    assert set(v["geomean"]) == set(names) - {"nightjar"}
    assert [p["best_static"] in ("no-spec", "ngram-2") for p in v["oracle"]["phases"]] == [True] * 3
    assert v["oracle"]["room"] >= 1.0
    assert [c["name"] for c in v["checks"]][:3] == [
        f"no harm: {p['label']} vs {p['best_static']}" for p in v["oracle"]["phases"]
    ]

    report = (out / "report.md").read_text()
    for name in names:
        for label in labels:
            assert f"| {name} | {label} |" in report, (name, label)
    for label in labels[:3]:
        assert f"| {label} |" in report and "| oracle (" in report
    assert "- loop: closed" in report and "- CPUs: in-process services" in report
    assert "each phase counts equally" in report and "**Verdict: the claim" in report
