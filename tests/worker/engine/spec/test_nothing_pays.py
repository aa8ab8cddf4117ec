"""Where nothing pays, speculation must cost (almost) nothing: γ = 0 steps with drafters
resident run no drafter at all, and one speculative step after a long γ = 0 stretch (a
policy exploring) catches up only the drafter that drafts, over a bounded window of positions,
and defers the other drafters' counterfactual scoring (it would make each of them catch up
too) to the next speculative step in a row. Counted in drafter calls and tokens, not in time;
output stays the target's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.references import NEW
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.speculation import apply_decision


def counted(engine: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Tokens each model drafter computes, and calls into the n-gram drafter."""
    counts: dict[str, int] = {}
    for d in engine.spec.pool.models:
        counts[d.name] = 0

        def run(items: Any, orig: Any = d.runner.run, name: str = d.name) -> Any:
            counts[name] += sum(len(i.token_ids) for i in items)
            return orig(items)

        monkeypatch.setattr(d.runner, "run", run)
    ngram = engine.spec.pool.drafters["ngram"]
    counts["ngram"] = 0
    for method in ("catch_up", "propose", "score"):
        orig = getattr(ngram, method)

        def call(*args: Any, orig: Any = orig) -> Any:
            counts["ngram"] += 1
            return orig(*args)

        monkeypatch.setattr(ngram, method, call)
    return counts


def decide(version: int, gamma: int) -> Decision:
    return Decision(version=version, policy="t", gamma_table=[(ALL_BATCHES, gamma)], drafter="fd-head")


def test_gamma0_runs_no_drafter_and_one_speculative_step_catches_up_a_bounded_window(
    spec_models: dict[str, Path],
    head_dir: Path,
    spec_references: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = load_engine(
        spec_models["target"], drafters=[head_dir, spec_models["rand-a"]], block_size=4, num_blocks=64
    )
    assert engine.spec.pool is not None
    fd = engine.spec.pool.drafters["fd-head"]
    assert isinstance(fd, FeatureDrafter)
    fd.max_pending = 8
    counts = counted(engine, monkeypatch)
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    ids = [str(i) for i in range(3)]
    for i in ids:
        engine.add_request(EngineRequest(i, PROMPTS[int(i)], params))
    tokens: dict[str, list[int]] = {i: [] for i in ids}

    def step(version: int, gamma: int) -> Any:
        apply_decision(engine, decide(version, gamma))
        result = engine.step()
        for out in result.outputs:
            tokens[out.request_id] += out.new_token_ids
        return result.stats

    for v in range(1, 13):  # prefill, then a long γ = 0 stretch with the drafters resident
        step(v, 0)
    assert engine.memory.resident and all(n == 0 for n in counts.values()), counts
    assert all(0 < fd.pending_rows(i) <= fd.max_pending for i in ids), "features kept, bounded"

    explore = step(13, 2)  # one speculative step after the stretch
    assert explore.gamma == 2 and explore.batch_size == 3
    (catch,) = explore.switch_costs
    assert catch.drafter == "fd-head" and 0 < catch.tokens <= fd.max_pending
    # The drafter that drafts computes at most its window and its drafts; nobody else works.
    assert 0 < counts["fd-head"] <= 3 * (fd.max_pending + 2), counts
    assert counts["rand-a"] == 0 and counts["ngram"] == 0, counts
    assert (
        set(explore.counterfactual) == {"fd-head"} and explore.counterfactual_time == 0.0
    )  # its own, realised

    again = step(14, 2)  # speculation stays on: the other drafters are scored from now on
    assert {"rand-a", "ngram"} <= set(again.counterfactual)
    assert counts["rand-a"] > 0 and counts["ngram"] > 0
    v = 15
    while engine.has_unfinished():
        step(v, 0 if v % 5 else 2)
        v += 1
    assert [tokens[i] for i in ids] == spec_references[:3], "output differs from the target alone"


def test_a_decision_that_asks_no_scores_runs_no_other_drafter(
    spec_models: dict[str, Path], spec_references: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixed drafter (a static policy: ``Decision.score_drafters`` false) costs no other
    drafter's forward: telemetry carries only the realised acceptance of the one that drafted.
    Asked for, every other drafter is scored on the same verified tokens. Output unchanged."""
    drafters = [spec_models["rand-a"], spec_models["rand-b"]]
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    for scores, skip in ((False, []), (True, []), (True, ["rand-b"])):
        engine = load_engine(spec_models["target"], drafters=drafters, block_size=4, num_blocks=64)
        counts = counted(engine, monkeypatch)
        ids = [str(i) for i in range(3)]
        for i in ids:
            engine.add_request(EngineRequest(i, PROMPTS[int(i)], params))
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        stats = []
        v = 1
        while engine.has_unfinished():
            apply_decision(engine,
                Decision(version=v, policy="t", gamma_table=[(ALL_BATCHES, 2)], drafter="rand-a",
                         score_drafters=scores, skip_drafters=skip)
            )  # fmt: skip
            result = engine.step()
            stats.append(result.stats)
            for out in result.outputs:
                tokens[out.request_id] += out.new_token_ids
            v += 1
        assert [tokens[i] for i in ids] == spec_references[:3], "output differs from the target alone"
        drafted = [s for s in stats if s.gamma > 0]
        assert drafted and counts["rand-a"] > 0
        if skip:  # a drafter the planner found dominated is not scored; the others are
            assert counts["rand-b"] == 0 and counts["ngram"] > 0, counts
            assert all("rand-b" not in s.counterfactual for s in stats)
        elif scores:
            assert counts["rand-b"] > 0 and counts["ngram"] > 0
            assert any({"rand-b", "ngram"} <= set(s.counterfactual) for s in drafted)
        else:
            assert counts["rand-b"] == 0 and counts["ngram"] == 0, counts
            assert all(set(s.counterfactual) <= {"rand-a"} and s.counterfactual_time == 0.0 for s in stats)
