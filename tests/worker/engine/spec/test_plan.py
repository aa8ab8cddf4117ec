"""The cost rule (worker/engine/spec/plan.py): per sequence, the (drafter, γ) of least
predicted time per token; bounded switching; n-gram by its runs; and nothing speculative at
all where no drafter can pay. The prompt prior and the γ = 0 scores: test_scoring.py. The
engine tests run the bench in cost_rule.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from shared.control import Decision, StepCosts
from shared.schemas import SamplingParams
from tests.worker.engine.spec.cost_rule import (
    CODE,
    CODE_PROMPTS,
    DRAFTERS,
    PLAIN,
    PROSE,
    STORY_PROMPTS,
    cheap_costs,
    drain,
    nj_engine,
    rule_decision,
)
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.spec import plan, scoring
from worker.engine.spec.lookahead import LookaheadJudge
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.ngram import NgramDrafter
from worker.engine.spec.plan import CostRule, SeqSpec
from worker.speculation import apply_decision, plan_from


def test_the_rule_speculates_where_it_pays_and_not_where_it_cannot() -> None:
    rule = CostRule(plan_from(rule_decision()))
    assert rule.drafters == sorted(DRAFTERS) and rule.gamma_max == 4
    alphas = dict.fromkeys(DRAFTERS, 0.4) | {CODE: 0.8}
    name, gamma, loss = rule.best(1, alphas, DRAFTERS)
    assert name == CODE and gamma == 4 and loss < 1.0
    assert rule.best(1, dict.fromkeys(DRAFTERS, 0.05), DRAFTERS)[:2] == (None, 0)  # nothing accepted: plain
    assert rule.best(16, dict.fromkeys(DRAFTERS, 0.95), DRAFTERS)[:2] == (None, 0)  # dear verify: plain
    assert rule.best(1, alphas, [PROSE])[0] == PROSE  # only allowed drafters
    assert (
        rule.could_pay(4, DRAFTERS) and not rule.could_pay(8, DRAFTERS) and not rule.could_pay(32, DRAFTERS)
    )
    # between the predicted batch sizes the costs are interpolated
    assert rule.loss(6, CODE, 1, 0.0) == pytest.approx((1.15 + 4.0) / 2)


def test_a_sequence_switches_at_most_once_per_hold_unless_its_batch_class_changes() -> None:
    """Acceptance swinging between two drafters every step would switch every step; with
    hold K a sequence keeps its pair K steps. A change of batch-size class re-decides at once."""
    rule = CostRule(plan_from(rule_decision(hold=5)))
    spec = SeqSpec()
    pairs = []
    for step in range(40):
        good, bad = (CODE, PROSE) if step % 2 == 0 else (PROSE, CODE)
        spec.counts = {good: [40.0, 50.0], bad: [5.0, 50.0]}
        pairs.append(rule.choose(spec, 1, DRAFTERS))
    changes = [i for i in range(1, len(pairs)) if pairs[i] != pairs[i - 1]]
    assert changes and all(b - a >= 5 for a, b in itertools.pairwise(changes)), changes
    # a class change (batch 1 -> 16) re-decides at once: plain decoding there
    assert rule.choose(spec, 16, DRAFTERS) == (None, 0)
    # a small edge does not displace the held pair either (MARGIN)
    spec2 = SeqSpec(counts={CODE: [30.0, 50.0], PROSE: [30.0, 50.0]})
    first = rule.choose(spec2, 1, DRAFTERS)
    for _ in range(10):
        assert rule.choose(spec2, 1, DRAFTERS) == first


def test_a_switch_waits_the_k_of_the_drafter_it_switches_into() -> None:
    """A switch pays the catch-up of the drafter it goes to: into n-gram (nothing to catch up,
    K 2) after 2 steps, into the code head (K 6) after 6, into plain decoding (nothing to
    catch up: the least K) after 2."""
    rule = CostRule(plan_from(rule_decision(hold=6).model_copy(update={"hold_by_drafter": {"ngram": 2}})))
    low = {d: [1.0, 50.0] for d in DRAFTERS}
    for held, into, limit in ((CODE, "ngram", 2), ("ngram", CODE, 6), (CODE, None, 2)):
        spec = SeqSpec(counts=low | {held: [45.0, 50.0]})
        assert rule.choose(spec, 1, DRAFTERS)[0] == held
        spec.counts = low | ({into: [45.0, 50.0]} if into is not None else {})  # now far better
        steps = 1
        while rule.choose(spec, 1, DRAFTERS)[0] == held:
            steps += 1
        assert steps == limit and spec.drafter == into, (held, into)


def test_a_switch_into_a_drafter_few_tokens_behind_waits_k_in_proportion() -> None:
    """K is for a catch-up of ``hold_tokens`` tokens: a drafter 8 of 64 tokens behind waits
    an eighth of its K (at least 1 step), one 64 or more behind its whole K; without
    ``hold_tokens`` (an older planner) K whatever the lag."""
    update = {"hold_by_drafter": {"ngram": 2, CODE: 16}, "hold_tokens": 64}
    rule = CostRule(plan_from(rule_decision(hold=6).model_copy(update=update)))
    assert [rule.k_into(CODE, lag) for lag in (None, 0, 8, 32, 64, 500)] == [16, 1, 2, 8, 16, 16]
    assert rule.k_into(None, 3) == 2  # plain decoding: the least K, nothing to catch up
    old = CostRule(plan_from(rule_decision(hold=6).model_copy(update={"hold_by_drafter": {CODE: 16}})))
    assert old.k_into(CODE, 8) == 16
    low = {d: [1.0, 50.0] for d in DRAFTERS}
    for lag, limit in ((8, 2), (64, 16)):
        spec = SeqSpec(counts=low | {PROSE: [45.0, 50.0]})
        assert rule.choose(spec, 1, DRAFTERS, lags={CODE: lag})[0] == PROSE
        spec.counts = low | {CODE: [45.0, 50.0]}  # now the code drafter is far better
        steps = 1
        while rule.choose(spec, 1, DRAFTERS, lags={CODE: lag})[0] == PROSE:
            steps += 1
        assert steps == limit and spec.drafter == CODE, (lag, steps)


def test_flips_between_plain_decoding_and_ngram_count_toward_a_model_drafters_k() -> None:
    """n-gram proposes on one step and not the next; the sequence flips between it and plain
    decoding at once, and those steps count toward the K of a switch into a model drafter
    together (counted per pair, every flip restarted the count and the model drafter that
    pays between n-gram's runs was never reached). Not toward a feature head's."""
    low = {"acceptance": dict.fromkeys(DRAFTERS, 0.1)}
    rule = CostRule(plan_from(rule_decision(hold=6).model_copy(update=low)))
    spec = SeqSpec()
    for _ in range(int(plan.RUNS_MIN) + 2):
        spec.judged("ngram", 4, proposed=4, depth=4)  # its proposals are always right
    spec.counts = {CODE: [45.0, 50.0]}  # and the code drafter pays where n-gram proposes nothing
    head = SeqSpec(counts=dict(spec.counts), runs={k: list(v) for k, v in spec.runs.items()})
    lags = {CODE: 64}  # a model drafter 64 tokens behind: its whole K (6)
    pairs = [rule.choose(spec, 1, DRAFTERS, {"ngram": 4 if i % 2 == 0 else 0}, lags) for i in range(8)]
    assert pairs[:6] == [("ngram", 4), (None, 0)] * 3, pairs
    assert pairs[6][0] == "ngram" and pairs[7][0] == CODE, pairs  # K = 6 steps of the family
    # a drafter without a lag (a feature head, whose context restarts) counts the held pair's
    # steps only: flipping every step, the sequence never holds one pair for its K
    flips = [rule.choose(head, 1, DRAFTERS, {"ngram": 4 if i % 2 == 0 else 0}) for i in range(12)]
    assert CODE not in {d for d, _ in flips}, flips


def test_a_sequences_acceptance_starts_at_the_prior_and_follows_its_own_verifications() -> None:
    spec = SeqSpec()
    prior = {CODE: 0.3}
    assert spec.alpha(CODE, prior) == pytest.approx(0.3)
    assert spec.alpha("other", prior) == pytest.approx(plan.DEFAULT_ACCEPTANCE)
    spec.add(CODE, 20, 24, scoring.PROMPT_WEIGHT)  # the prompt: 20 of 24, at a quarter weight
    assert spec.alpha(CODE, prior) == pytest.approx((4 * 0.3 + 5) / (4 + 6))
    for _ in range(30):
        spec.learn({CODE: (1.0, 4)})  # its own verifications: 1 in 4
    assert spec.alpha(CODE, prior) == pytest.approx(0.25, abs=0.04)


def test_a_sequences_ngram_runs_replace_e_alpha_gamma_once_enough_are_judged() -> None:
    """n-gram hits come in runs: where it proposes, nothing at half the positions and all four
    at the other half is 3 tokens a verification at γ = 4, which a per-token prior of 0.1 would
    price at 1.1. Positions where it proposed nothing do not count (it is not chosen there)."""
    rule = CostRule(
        plan_from(rule_decision().model_copy(update={"acceptance": dict.fromkeys(DRAFTERS, 0.1)}))
    )
    spec = SeqSpec()
    alphas = {d: spec.alpha(d, rule.prior) for d in DRAFTERS}
    assert rule.best(1, alphas, DRAFTERS, spec)[:2] == (None, 0)  # the prior alone: plain
    for i in range(int(plan.RUNS_MIN) + 2):
        spec.judged("ngram", 4 if i % 2 else 0, proposed=4, depth=4)
        spec.judged("ngram", 0, proposed=0, depth=4)  # no proposal: not a run of 0
    assert spec.run_tokens("ngram", 4) == pytest.approx(3.0, abs=0.2)
    assert spec.run_tokens("ngram", 1) == pytest.approx(1.5, abs=0.1)
    assert spec.run_tokens(CODE, 4) is None and spec.run_tokens("ngram", 5) is None
    assert rule.best(1, alphas, DRAFTERS, spec)[:2] == ("ngram", 4)
    assert rule.choose(spec, 1, DRAFTERS) == ("ngram", 4)


def test_ngram_is_chosen_at_most_at_the_length_it_proposes_and_leaves_plain_decoding_at_once() -> None:
    """A model-free drafter runs only at a γ it has a proposal for (none: plain decoding), and
    between it and plain decoding, which cost no catch-up, a sequence switches without waiting K."""
    low = {"acceptance": dict.fromkeys(DRAFTERS, 0.1)}
    rule = CostRule(plan_from(rule_decision(hold=6).model_copy(update=low)))
    spec = SeqSpec()
    for _ in range(int(plan.RUNS_MIN) + 2):
        spec.judged("ngram", 4, proposed=4, depth=4)  # its proposals are always right
    assert rule.choose(spec, 1, DRAFTERS, {"ngram": 2}) == ("ngram", 2)
    assert rule.choose(spec, 1, DRAFTERS, {"ngram": 0}) == (None, 0)  # nothing proposed: plain
    assert rule.choose(spec, 1, DRAFTERS, {"ngram": 4}) == ("ngram", 4)  # back at once, no K
    # a head's pair is not left for a passing n-gram proposal before K steps
    head = SeqSpec(counts={CODE: [45.0, 50.0]}, runs=dict(spec.runs))
    assert rule.choose(head, 1, DRAFTERS, {"ngram": 0})[0] == CODE
    assert rule.choose(head, 1, DRAFTERS, {"ngram": 4})[0] == CODE  # into n-gram it waits K (6 here)
    # n-gram held with nothing to propose is plain decoding held: a head still waits its K
    held = SeqSpec(runs=dict(spec.runs))
    assert rule.choose(held, 1, DRAFTERS, {"ngram": 4}) == ("ngram", 4)
    held.counts = {CODE: [45.0, 50.0]}
    pairs = [rule.choose(held, 1, DRAFTERS, {"ngram": 0}) for _ in range(6)]
    assert pairs[:5] == [(None, 0)] * 5 and pairs[5][0] == CODE
    # a held n-gram pair runs at what it proposes now
    short = SeqSpec(runs=dict(spec.runs))
    assert rule.choose(short, 1, DRAFTERS, {"ngram": 4}) == ("ngram", 4)
    assert rule.choose(short, 1, DRAFTERS, {"ngram": 3}) == ("ngram", 3)


# ------------------------------------------------------------------ in the engine


def test_nothing_speculative_runs_where_no_drafter_can_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 16 sequences the decision's verify costs 3 + γ plain steps: even at the highest
    plausible acceptance no drafter pays, so for 200 busy steps no drafter runs a forward or
    a lookup, no prompt is scored, no feature is handed over and no lookahead is judged."""
    calls: dict[str, int] = {"feed": 0, "ngram": 0, "judge": 0}

    def counted(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(ModelDrafter, "_feed", counted("feed", ModelDrafter._feed))
    for method in ("propose", "score", "catch_up"):
        monkeypatch.setattr(NgramDrafter, method, counted("ngram", getattr(NgramDrafter, method)))
    monkeypatch.setattr(LookaheadJudge, "judge_each", counted("judge", LookaheadJudge.judge_each))
    engine = nj_engine()
    apply_decision(engine, rule_decision())
    tok = engine.tokenizer
    prompts = (CODE_PROMPTS + STORY_PROMPTS) * 4
    for i, text in enumerate(prompts):
        engine.add_request(
            EngineRequest(f"r{i}", tok.encode(text), SamplingParams(max_tokens=400, ignore_eos=True))
        )
    busy = 0
    for _ in range(210):
        stats = engine.step().stats
        busy += stats.batch_size == 16
    assert busy >= 200
    assert calls == {"feed": 0, "ngram": 0, "judge": 0}


def test_a_drafter_that_cannot_pay_at_the_batch_size_is_not_scored(monkeypatch: pytest.MonkeyPatch) -> None:
    """n-gram's steps are cheap and the model drafters' dear at every batch size (so
    speculative work runs, for n-gram): the prompts are scored by n-gram only (a model
    drafter's score is a forward over the whole prompt) and no model drafter is scored
    counterfactually while n-gram drafts; output stays the target's."""
    feeds = {"n": 0}
    feed = ModelDrafter._feed

    def counted(self: ModelDrafter, jobs: list) -> list:  # type: ignore[type-arg]
        feeds["n"] += 1
        return feed(self, jobs)

    cheap, dear = cheap_costs(cheap_upto=64), cheap_costs(cheap_upto=0)
    costs = [
        StepCosts(
            batch=c.batch,
            plain_s=c.plain_s,
            spec_s={"ngram": c.spec_s["ngram"]} | {d: d_.spec_s[d] for d in (CODE, PROSE)},
        )
        for c, d_ in zip(cheap, dear, strict=True)
    ]
    decision = rule_decision(version=2).model_copy(update={"step_costs": costs})
    engine = nj_engine()
    prompts = {f"r{i}": p for i, p in enumerate((CODE_PROMPTS + STORY_PROMPTS) * 2)}
    reference, _ = drain(engine, prompts, PLAIN)
    monkeypatch.setattr(ModelDrafter, "_feed", counted)
    got, seen = drain(engine, prompts, decision)
    assert got == reference
    steps = seen["steps"]
    assert sum(s.prompts_scored for s in steps) == len(prompts)
    assert sum(s.drafter_shares.get("ngram", 0) for s in steps) > 0  # n-gram drafted
    assert feeds["n"] == 0  # no model drafter forward: not scored, not drafting
    assert not any(set(s.counterfactual) & {CODE, PROSE} for s in steps)


def test_step_costs_must_ascend() -> None:
    from pydantic import ValidationError

    costs = cheap_costs()
    with pytest.raises(ValidationError, match="ascending"):
        Decision(version=1, policy="t", step_costs=[costs[1], costs[0]])
    with pytest.raises(ValidationError, match="ascending"):
        Decision(version=1, policy="t", step_costs=[costs[0], costs[0]])


def test_a_sequence_whose_text_repeats_drafts_with_ngram_without_exploring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n-gram's prior is 0.05 (by E(α, γ) it never pays), but the lookahead judges n-gram
    on the sequence's own output at every γ = 0 step: a story that repeats itself drafts with
    n-gram once its runs say so, exactly; without the runs it never speculates."""
    story = {"story": "Once upon a time"}
    decision = rule_decision(version=2, skip_drafters=[CODE, PROSE]).model_copy(
        update={"acceptance": dict.fromkeys(DRAFTERS, 0.05)}
    )
    engine = nj_engine()
    reference, _ = drain(engine, story, PLAIN)
    got, seen = drain(engine, story, decision)
    assert got == reference
    ngram = [s for s in seen["steps"] if s.drafter_shares.get("ngram")]
    assert ngram and sum(s.accepted for s in ngram) > 0
    monkeypatch.setattr(plan, "RUNS_MIN", 1e9)
    got, seen = drain(engine, story, decision.model_copy(update={"version": 3}))
    assert got == reference and not any(s.drafter_shares for s in seen["steps"])


def test_a_feature_heads_lag_is_the_features_it_has_not_read(
    spec_models: dict[str, Path], head_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A feature head catches up exactly on the features it holds (feature_drafter.py), so
    the rule gets its lag as a model drafter's and a switch into it waits K in proportion
    (a head left for a few n-gram steps is a few features behind); output stays exact."""
    seen: list[dict[str, int]] = []
    choose = CostRule.choose

    def recorded(self: CostRule, spec: SeqSpec, batch: int, allowed, proposals=None, lags=None):  # type: ignore[no-untyped-def]
        seen.append(dict(lags or {}))
        return choose(self, spec, batch, allowed, proposals, lags)

    engine = load_engine(spec_models["target"], drafters=[head_dir], num_blocks=64)
    head = "fd-head"
    spec_s = {head: [1.1 + 0.05 * g for g in range(1, 5)]}
    head_costs = [StepCosts(batch=b, plain_s=1.0, spec_s=spec_s) for b in (1, 2, 4)]
    decision = Decision(
        version=2, policy="t", drafter_scope="request", step_costs=head_costs,
        acceptance={head: 0.3}, acceptance_hi={head: 0.6}, hold_steps=4,
    )  # fmt: skip
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    prompt = list(range(5, 40))

    def run(rid: str) -> list[int]:
        engine.add_request(EngineRequest(rid, prompt, params))
        out: list[int] = []
        while engine.has_unfinished():
            out += [t for o in engine.step().outputs for t in o.new_token_ids]
        return out

    apply_decision(engine, PLAIN)
    reference = run("ref")
    monkeypatch.setattr(CostRule, "choose", recorded)
    apply_decision(engine, decision)
    assert run("r") == reference
    assert seen and all(head in lags and lags[head] >= 0 for lags in seen)
    assert any(lags[head] > 0 for lags in seen)  # it fell behind while not drafting, and said so
