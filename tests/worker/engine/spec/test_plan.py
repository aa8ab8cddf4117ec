"""The cost rule (worker/engine/spec/plan.py): per sequence, the (drafter, γ) of least
predicted time per token; the prompt as each drafter's first evidence; bounded switching; and
nothing speculative at all where no drafter can pay.

The engine tests run the bundled nj-target with its two trained drafters (nj-draft-code:
~0.73 accepted on code, ~0.08 on stories; nj-draft-prose the reverse, MODELS.md) and n-gram,
under a decision whose step costs make speculation cheap up to batch 4 and dear from batch 8.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from shared.control import ALL_BATCHES, Decision, StepCosts
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.engine.spec import plan
from worker.engine.spec.lookahead import LookaheadJudge
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.ngram import NgramDrafter
from worker.engine.spec.plan import CostRule, PromptCentre, SeqSpec
from worker.speculation import apply_decision, plan_from

MODELS = Path(__file__).resolve().parents[4] / "models"
CODE, PROSE = "nj-draft-code", "nj-draft-prose"
DRAFTERS = (CODE, PROSE, "ngram")
CODE_PROMPTS = ["def fibonacci(n):\n    ", "import os\n\ndef read_lines(path):\n    "]
STORY_PROMPTS = ["Once upon a time there was a little fox who", "Tom and Lily went to the park to"]


def _costs(cheap_upto: int = 4, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> list[StepCosts]:
    """A plain step costs 1; a speculative one 1.1 + 0.05·γ up to ``cheap_upto`` sequences,
    then 3 + γ (the verify forward compute-bound)."""
    out = []
    for b in batches:
        cheap = b <= cheap_upto
        spec = [(1.1 + 0.05 * g) if cheap else (3.0 + g) for g in range(1, 5)]
        out.append(StepCosts(batch=b, plain_s=1.0, spec_s={d: list(spec) for d in DRAFTERS}))
    return out


def _decision(version: int = 1, hold: int = 4, **kw: object) -> Decision:
    return Decision(
        version=version,
        policy="t",
        gamma_table=[(ALL_BATCHES, 0)],
        drafter_scope="request",
        step_costs=_costs(),
        acceptance={d: 0.4 for d in DRAFTERS},
        acceptance_hi={d: 0.6 for d in DRAFTERS},
        hold_steps=hold,
        **kw,  # type: ignore[arg-type]
    )


def test_the_rule_speculates_where_it_pays_and_not_where_it_cannot() -> None:
    rule = CostRule(plan_from(_decision()))
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
    rule = CostRule(plan_from(_decision(hold=5)))
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
    rule = CostRule(plan_from(_decision(hold=6).model_copy(update={"hold_by_drafter": {"ngram": 2}})))
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
    rule = CostRule(plan_from(_decision(hold=6).model_copy(update=update)))
    assert [rule.k_into(CODE, lag) for lag in (None, 0, 8, 32, 64, 500)] == [16, 1, 2, 8, 16, 16]
    assert rule.k_into(None, 3) == 2  # plain decoding: the least K, nothing to catch up
    old = CostRule(plan_from(_decision(hold=6).model_copy(update={"hold_by_drafter": {CODE: 16}})))
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
    rule = CostRule(plan_from(_decision(hold=6).model_copy(update=low)))
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
    spec.add(CODE, 20, 24, plan.PROMPT_WEIGHT)  # the prompt: 20 of 24, at a quarter weight
    assert spec.alpha(CODE, prior) == pytest.approx((4 * 0.3 + 5) / (4 + 6))
    for _ in range(30):
        spec.learn({CODE: (1.0, 4)})  # its own verifications: 1 in 4
    assert spec.alpha(CODE, prior) == pytest.approx(0.25, abs=0.04)


def test_a_sequences_ngram_runs_replace_e_alpha_gamma_once_enough_are_judged() -> None:
    """n-gram hits come in runs: where it proposes, nothing at half the positions and all four
    at the other half is 3 tokens a verification at γ = 4, which a per-token prior of 0.1 would
    price at 1.1. Positions where it proposed nothing do not count (it is not chosen there)."""
    rule = CostRule(plan_from(_decision().model_copy(update={"acceptance": dict.fromkeys(DRAFTERS, 0.1)})))
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
    rule = CostRule(plan_from(_decision(hold=6).model_copy(update=low)))
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


def test_the_prompt_prior_shifts_the_planners_prior_by_the_prompts_distance_from_recent_ones() -> None:
    """A drafter that agrees with every chat prompt's text at 15 % (its answers' drafts at 35 %,
    the planner's prior) starts each chat request at its prior, not at 15 %; a prompt it agrees
    with more than with the recent ones starts above the prior, one it agrees with less below."""
    centre = PromptCentre()
    prior = {CODE: 0.35, PROSE: 0.5}
    for _ in range(20):
        (got,) = centre.centred([{CODE: (3.6, 24)}], prior)
        assert got[CODE] == (pytest.approx(0.35 * 24), 24)
    above, below = centre.centred([{CODE: (12.0, 24)}, {CODE: (0.0, 24)}], prior)
    assert above[CODE][0] / 24 > 0.35 + 0.2 and below[CODE][0] / 24 < 0.35 - 0.05
    # the first prompts of a batch rank against each other: a code prompt above a story one
    fresh = PromptCentre().centred(
        [{CODE: (12.0, 24), PROSE: (2.0, 24)}, {CODE: (2.0, 24), PROSE: (12.0, 24)}], prior
    )
    assert fresh[0][CODE][0] > fresh[1][CODE][0] and fresh[1][PROSE][0] > fresh[0][PROSE][0]
    assert all(0.0 <= a <= n for row in fresh for a, n in row.values())


def test_a_sequence_at_gamma_0_is_scored_within_a_share_of_the_step_time() -> None:
    """Every 8th γ = 0 step at least; where a score is dear against the plain step, or many
    sequences run γ = 0, less often, so the scores cost at most ``PLAIN_SCORE_SHARE`` of a
    plain step on average; each reads at most the last ``PLAIN_SCORE_MAX`` tokens."""
    every, share = plan.PLAIN_SCORE_EVERY, plan.PLAIN_SCORE_SHARE
    assert plan.plain_score_every(1, None, 0.036) == every  # nothing measured yet
    assert plan.plain_score_every(1, 0.004, 0.036) == every  # SmolLM2 fp32: 0.5 ms a step
    slow = plan.plain_score_every(1, 0.001, 0.002)  # nj-target: a 1 ms score on a 2 ms step
    assert slow == 25 and 0.001 / slow <= share * 0.002
    assert plan.plain_score_every(16, 0.001, 0.002) == 16 * 25  # 16 sequences at γ = 0
    spec = SeqSpec()
    due = [spec.plain_step(every) for _ in range(3 * every)]
    assert due == ([0] * (every - 1) + [every]) * 3  # the tokens since the last score, then 0 again
    due = [spec.plain_step(slow) for _ in range(2 * slow)]
    assert due == ([0] * (slow - 1) + [plan.PLAIN_SCORE_MAX]) * 2


# ------------------------------------------------------------------ in the engine


def _engine() -> LLMEngine:
    return load_engine(MODELS / "nj-target", drafters=[MODELS / CODE, MODELS / PROSE], num_blocks=512)


def _params(n: int = 32) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def _drain(
    engine: LLMEngine, prompts: dict[str, str], decision: Decision
) -> tuple[dict[str, list[int]], dict]:
    apply_decision(engine, decision)
    tok = engine.tokenizer
    for rid, text in prompts.items():
        engine.add_request(EngineRequest(rid, tok.encode(text), _params()))
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    first: dict[str, str | None] = {}
    steps = []
    while engine.has_unfinished():
        result = engine.step()
        engine.check_integrity()
        steps.append(result.stats)
        for rid, seq in engine._seqs.items():
            if seq.spec.prompt_scored and rid not in first:
                first[rid] = seq.spec.drafter
        for o in result.outputs:
            out[o.request_id] += o.new_token_ids
    return out, {"first": first, "steps": steps}


def test_the_prompt_picks_each_requests_drafter_on_its_first_decode_step_and_output_is_exact() -> None:
    engine = _engine()
    prompts = {f"code-{i}": p for i, p in enumerate(CODE_PROMPTS)} | {
        f"story-{i}": p for i, p in enumerate(STORY_PROMPTS)
    }
    plain = Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)])
    reference, _ = _drain(engine, prompts, plain)
    got, seen = _drain(engine, prompts, _decision(version=2))
    assert got == reference  # the target's output alone, token for token
    for rid, name in seen["first"].items():
        assert name == (CODE if rid.startswith("code") else PROSE), seen["first"]
    steps = seen["steps"]
    assert sum(s.prompts_scored for s in steps) == len(prompts)
    assert any(s.drafter_shares.get(CODE) and s.drafter_shares.get(PROSE) for s in steps)  # both in one step
    assert sum(s.accepted for s in steps) > 0


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
    engine = _engine()
    apply_decision(engine, _decision())
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

    cheap, dear = _costs(cheap_upto=64), _costs(cheap_upto=0)
    costs = [
        StepCosts(
            batch=c.batch,
            plain_s=c.plain_s,
            spec_s={"ngram": c.spec_s["ngram"]} | {d: d_.spec_s[d] for d in (CODE, PROSE)},
        )
        for c, d_ in zip(cheap, dear, strict=True)
    ]
    decision = _decision(version=2).model_copy(update={"step_costs": costs})
    engine = _engine()
    prompts = {f"r{i}": p for i, p in enumerate((CODE_PROMPTS + STORY_PROMPTS) * 2)}
    reference, _ = _drain(engine, prompts, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)]))
    monkeypatch.setattr(ModelDrafter, "_feed", counted)
    got, seen = _drain(engine, prompts, decision)
    assert got == reference
    steps = seen["steps"]
    assert sum(s.prompts_scored for s in steps) == len(prompts)
    assert sum(s.drafter_shares.get("ngram", 0) for s in steps) > 0  # n-gram drafted
    assert feeds["n"] == 0  # no model drafter forward: not scored, not drafting
    assert not any(set(s.counterfactual) & {CODE, PROSE} for s in steps)


def test_a_drafter_failing_on_a_prompt_costs_no_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt scoring runs drafter forwards before the step's isolated phases: a drafter that
    raises there resets the drafters, the sequences start from the prior, and the output is
    the target's alone."""
    from worker.engine.spec.pool import DrafterPool

    engine = _engine()
    prompts = {f"code-{i}": p for i, p in enumerate(CODE_PROMPTS)}
    reference, _ = _drain(engine, prompts, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)]))

    def broken(self: DrafterPool, seqs: list, starts: list, names: object = None) -> list:  # type: ignore[type-arg]
        raise RuntimeError("a drafter bug")

    monkeypatch.setattr(DrafterPool, "prompt_hits", broken)
    got, seen = _drain(engine, prompts, _decision(version=2))
    assert got == reference
    assert sum(s.prompts_scored for s in seen["steps"]) == len(prompts)


def test_step_costs_must_ascend() -> None:
    from pydantic import ValidationError

    costs = _costs()
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
    decision = _decision(version=2, skip_drafters=[CODE, PROSE]).model_copy(
        update={"acceptance": dict.fromkeys(DRAFTERS, 0.05)}
    )
    engine = _engine()
    reference, _ = _drain(engine, story, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)]))
    got, seen = _drain(engine, story, decision)
    assert got == reference
    ngram = [s for s in seen["steps"] if s.drafter_shares.get("ngram")]
    assert ngram and sum(s.accepted for s in ngram) > 0
    monkeypatch.setattr(plan, "RUNS_MIN", 1e9)
    got, seen = _drain(engine, story, decision.model_copy(update={"version": 3}))
    assert got == reference and not any(s.drafter_shares for s in seen["steps"])


def test_a_sequence_at_gamma_0_learns_the_model_drafters_from_its_own_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The drafters' prior is 0.05 (by E(α, γ) none pays): a story runs γ = 0, verifies
    nothing, and would learn nothing about the prose drafter. Every ``PLAIN_SCORE_EVERY``-th
    γ = 0 step scores the model drafters on its last tokens (the step reports them as its
    counterfactual, for the planner): the story finds the prose drafter pays and drafts with
    it, exactly; without those scores it never speculates."""
    story = {"story": STORY_PROMPTS[0]}
    decision = _decision(version=2, skip_drafters=["ngram"]).model_copy(
        update={"acceptance": dict.fromkeys(DRAFTERS, 0.05)}
    )
    engine = _engine()
    reference, _ = _drain(engine, story, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)]))
    got, seen = _drain(engine, story, decision)
    assert got == reference
    steps = seen["steps"]
    scored = [s for s in steps if s.gamma == 0 and s.counterfactual]
    assert scored and all(set(s.counterfactual) == {CODE, PROSE} for s in scored)
    assert all(s.counterfactual_time > 0 for s in scored)
    prose = [s for s in steps if s.drafter_shares.get(PROSE)]
    assert prose and sum(s.accepted for s in prose) > 0
    monkeypatch.setattr(plan, "PLAIN_SCORE_EVERY", 10**9)
    got, seen = _drain(engine, story, decision.model_copy(update={"version": 3}))
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
    costs = [StepCosts(batch=b, plain_s=1.0, spec_s=spec_s) for b in (1, 2, 4)]
    decision = Decision(
        version=2, policy="t", drafter_scope="request", step_costs=costs,
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

    apply_decision(engine, Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)]))
    reference = run("ref")
    monkeypatch.setattr(CostRule, "choose", recorded)
    apply_decision(engine, decision)
    assert run("r") == reference
    assert seen and all(head in lags and lags[head] >= 0 for lags in seen)
    assert any(lags[head] > 0 for lags in seen)  # it fell behind while not drafting, and said so
