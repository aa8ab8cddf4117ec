"""Regime workloads: phases with users and content, the content library, the closed-loop
plan, the generated line-up and CPU pinning."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.load.configs import lineup, select_configs
from benchmarks.load.contents import ContentLibrary, code_prefix
from benchmarks.load.phases import Phase, is_closed_loop, parse_phases, windows
from benchmarks.load.plan import ClosedLoopPlan, LengthRule, build_plan, make_plan
from benchmarks.load.regime import config_specs, pinning
from benchmarks.load.workloads import WorkloadError, WorkloadItem

REGIME = "chat_low:4u:60:chat,mixed_high:32u:120:chat+code,code_low:4u:60:code"


def test_phases_take_users_and_content_and_the_old_spec_still_works() -> None:
    phases = parse_phases(REGIME)
    assert phases[1] == Phase("mixed_high", 0.0, 120.0, 32, ("chat", "code"))
    assert is_closed_loop(phases) and phases[0].load == "4 users"
    assert parse_phases("low:0.5:60") == [Phase("low", 0.5, 60.0)]
    assert parse_phases("a:2:5:stories+code")[0].content == ("stories", "code")
    assert not is_closed_loop(parse_phases("a:2:5:stories"))


@pytest.mark.parametrize("spec", ["a:0u:5", "a:xu:5", "a:4u:5,b:1:5", "a:1:5:chat+", "a:1:5:x:y"])
def test_bad_regime_phases_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_phases(spec)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    (tmp_path / "workloads").mkdir()
    (tmp_path / "corpus").mkdir()
    rows = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"chat prompt {i}"}]} for i in range(5)
    ]
    (tmp_path / "workloads" / "sharegpt_v3_filtered_1000.json").write_text(json.dumps(rows))
    story = " ".join(f"word{i}" for i in range(60))
    (tmp_path / "corpus" / "tinystories_val_head.txt").write_text(f"{story}\n\n{story} again\n\nshort\n")
    return tmp_path


def test_content_library_reads_sources_with_their_endpoints(data: Path) -> None:
    lib = ContentLibrary(data, seed=0)
    chat = lib.get("chat")
    assert sorted(it.prompt for it in chat) == [f"chat prompt {i}" for i in range(5)]
    assert {it.endpoint for it in chat} == {None} and {it.category for it in chat} == {"chat"}
    stories = lib.get("stories")
    assert len(stories) == 2 and stories[0].prompt.split()[:2] == ["word0", "word1"]
    assert {it.endpoint for it in stories} == {"completions"}
    code = lib.get("code")  # held-out standard-library source: always there
    assert len(code) > 10 and all(it.endpoint == "completions" for it in code)
    with pytest.raises(WorkloadError, match="unknown content"):
        lib.get("poetry")
    with pytest.raises(WorkloadError, match="alpaca"):
        lib.get("alpaca")  # its file is missing from this data dir


def test_code_prefix_ends_on_a_def_line() -> None:
    text = "\n".join(
        ["import os", "", "X = 1", "", "", "def f(x):", "    return x"] + ["# pad"] * 30 + ["class C:"]
    )
    prompts = code_prefix(text)
    assert [p.splitlines()[-1] for p in prompts] == ["def f(x):", "class C:"]


def test_open_loop_content_phases_alternate_their_sources(data: Path) -> None:
    phases = parse_phases("mix:20:2:chat+stories")
    plan = build_plan([], phases, 3, LengthRule("fixed", 8), library=ContentLibrary(data))
    assert plan == build_plan([], phases, 3, LengthRule("fixed", 8), library=ContentLibrary(data))
    cats = [r.item.category for r in plan]
    assert cats[:4] == ["chat", "stories", "chat", "stories"] and len(plan) > 10


def test_closed_loop_plan_is_a_function_of_window_and_count(data: Path) -> None:
    items = [WorkloadItem(str(i), "w", f"workload {i}") for i in range(3)]
    phases = parse_phases("a:2u:5:chat+stories,b:3u:5")
    plan = make_plan(items, phases, 1, LengthRule("fixed", 8), library=ContentLibrary(data))
    assert isinstance(plan, ClosedLoopPlan) and len(plan) == 16  # a preview: 8 per window
    a, b = windows(phases)
    first = plan.request(a, 0, 0, 0.0)
    assert first == plan.request(a, 0, 0, 0.0) and first.item.category == "chat"
    assert plan.request(a, 1, 1, 0.1).item.category == "stories"
    assert plan.request(b, 5, 9, 6.0).item.category == "w" and plan.request(b, 5, 9, 6.0).max_tokens == 8
    with pytest.raises(ValueError):
        make_plan([], parse_phases("b:3u:5"), 1, LengthRule("fixed", 8))


def test_lineup_has_every_static_pair_and_nightjar() -> None:
    specs = lineup(["ngram", "nj-draft-code"], [2, 4])
    assert specs == [
        "no-spec=static:gamma=0",
        "ngram-2=static:gamma=2,drafter=ngram", "ngram-4=static:gamma=4,drafter=ngram",
        "nj-draft-code-2=static:gamma=2,drafter=nj-draft-code",
        "nj-draft-code-4=static:gamma=4,drafter=nj-draft-code",
        "nightjar=nightjar",
    ]  # fmt: skip
    configs, notes = select_configs(specs, skip_unregistered=False)
    assert not notes and [c.is_no_spec for c in configs].count(True) == 1
    assert [c.name for c in configs if c.is_static] == ["no-spec", "ngram-2", "ngram-4",
                                                        "nj-draft-code-2", "nj-draft-code-4"]  # fmt: skip
    args = argparse.Namespace(config=None, lineup=True, gammas="3", drafters="ngram", model="unused")
    assert config_specs(args) == ["no-spec=static:gamma=0", "ngram-3=static:gamma=3,drafter=ngram",
                                  "nightjar=nightjar"]  # fmt: skip
    assert config_specs(argparse.Namespace(config=["a=static"], lineup=True)) == ["a=static"]
    assert config_specs(argparse.Namespace(config=None, lineup=False)) is None
    with pytest.raises(ValueError):
        config_specs(argparse.Namespace(config=None, lineup=True, gammas="0", drafters="ngram", model=""))


def test_service_processes_are_pinned_apart() -> None:
    from benchmarks.load.configs import BenchConfig
    from benchmarks.load.trio import TrioOptions
    from benchmarks.load.trio_procs import service_commands

    opts = TrioOptions("/m", worker_cpus="3", other_cpus="0,1,2")
    cmds = service_commands(BenchConfig("n", "nightjar"), opts, "redis://127.0.0.1:6379/14", 8000)
    assert cmds["worker"][:3] == ["taskset", "-c", "3"]
    assert cmds["planner"][:3] == cmds["gateway"][:3] == ["taskset", "-c", "0,1,2"]
    plain = service_commands(BenchConfig("n", "nightjar"), TrioOptions("/m"), "redis://h:1/0", 8000)
    assert all(c[0] != "taskset" for c in plain.values())


def test_pinning_puts_the_worker_on_the_last_core_and_the_rest_elsewhere() -> None:
    def ns(services: str = "processes", cpu: str = "last") -> argparse.Namespace:
        return argparse.Namespace(services=services, worker_cpu=cpu)

    p = pinning(ns(), [0, 1, 2, 3])
    assert (p.worker, p.others) == ("3", "0,1,2") and "taskset" in p.note and "CPU 3" in p.note
    assert pinning(ns(cpu="1,2"), [0, 1, 2, 3]).others == "0,3"
    assert pinning(ns(cpu="none"), [0, 1]).worker is None
    assert pinning(ns(), [0]).worker is None
    assert pinning(ns("inprocess"), [0, 1]).worker is None
    with pytest.raises(ValueError):
        pinning(ns(cpu="0,1"), [0, 1])  # nothing left for the others
    with pytest.raises(ValueError):
        pinning(ns(cpu="7"), [0, 1])
