"""Per-request drafter choice (worker/engine/spec/router.py): each sequence learns its own.

On the bundled nj-target with its two trained drafters (nj-draft-code: ~0.73 accepted on
code, ~0.08 on stories; nj-draft-prose the reverse, MODELS.md), a batch mixing code and
story requests, all starting at the prose drafter, ends with every code request drafted by
the code drafter and every story by the prose one, in the same steps; the output stays the
target's alone, token for token; and the mixed batch accepts more drafts than one drafter
for the whole batch does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from shared.control import ALL_BATCHES, Decision, StepStats
from shared.experts import ExpertLearner
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.engine.spec.router import RESCORE_EVERY, SETTLE_ROUNDS, DrafterChoice
from worker.speculation import apply_decision

MODELS = Path(__file__).resolve().parents[4] / "models"
CODE, PROSE = "nj-draft-code", "nj-draft-prose"
PROMPTS = {
    "code-0": "def fibonacci(n):\n    ",
    "code-1": "import os\n\ndef read_lines(path):\n    ",
    "story-0": "Once upon a time there was a little fox who",
    "story-1": "Tom and Lily went to the park to",
}
NEW = 40


def test_a_sequence_follows_the_drafter_its_own_feedback_favours() -> None:
    c = DrafterChoice(ExpertLearner("normalhedge", 1.0), PROSE)
    for _ in range(3):
        c.learn({PROSE: (0.4, 4), CODE: (3.2, 4)})
    assert c.current == CODE and c.switches == 1 and c.rounds == 3
    c.learn({})  # nothing verified: nothing learnt
    c.learn({PROSE: (0.0, 0)})
    assert c.rounds == 3


def test_the_loss_is_taken_at_the_sequences_rate_so_far_not_at_one_verifications() -> None:
    """A model drafter scored on the one token an empty n-gram proposal verified has rate 0
    or 1 there; E(α, γ) is convex, so losses at such rates favour it (at rate 1 it would give
    all γ + 1 tokens). Here n-gram proposes nothing two verifications in three and has two of
    four drafts accepted on the third (5 tokens in 3 verifications, at no draft cost); prose,
    right 0.6 a position at 0.2 of a target step a draft, would give E(0.6, 4) = 2.3 a
    verification for 1.8 times the time: slower. Judged per verification it looked faster."""
    c = DrafterChoice(ExpertLearner("normalhedge", 1.0), "ngram")
    costs = {PROSE: 0.2, "ngram": 0.0}
    trail = []
    for i in range(30):
        if i % 3 < 2:  # n-gram proposed nothing: one position verified, prose right on it 3 in 5
            c.learn({"ngram": (0.0, 1), PROSE: (float(i % 5 < 3), 1)}, 4, costs)
        else:  # n-gram's four drafts, 2 accepted; prose judged on the three emitted
            c.learn({"ngram": (2.0, 4), PROSE: (2.0, 3)}, 4, costs)
        trail.append(c.current)
    assert trail[-10:] == ["ngram"] * 10 and trail.count("ngram") >= 24, trail
    assert c.rate(PROSE) == pytest.approx(0.6, abs=0.1) and c.rate("ngram") == pytest.approx(0.33, abs=0.1)


def test_a_settled_sequence_is_scored_only_now_and_then() -> None:
    """Scoring costs a forward of every other drafter: a sequence is scored at every
    verification until its learner settles, then on every RESCORE_EVERY-th one (and at once
    again while its drafter's weight falls below SETTLE_WEIGHT)."""
    c = DrafterChoice(ExpertLearner("normalhedge", 1.0), PROSE)
    for _ in range(SETTLE_ROUNDS):
        assert c.wants_scores()
        c.learn({PROSE: (0.4, 4), CODE: (3.2, 4)})
    assert c.current == CODE and not c.wants_scores()
    pattern = []
    for _ in range(3 * RESCORE_EVERY):
        if c.wants_scores():
            pattern.append(1)
            c.learn({PROSE: (0.4, 4), CODE: (3.2, 4)})
        else:
            pattern.append(0)
            c.skip()
    assert pattern == ([0] * (RESCORE_EVERY - 1) + [1]) * 3
    for _ in range(40):  # the text changes: the code drafter stops being accepted
        c.learn({PROSE: (3.2, 4), CODE: (0.0, 4)})
        if c.current == PROSE:
            break
    assert c.current == PROSE


def _engine() -> LLMEngine:
    drafters = [MODELS / CODE, MODELS / PROSE]
    return load_engine(MODELS / "nj-target", drafters=drafters, ngram=False, num_blocks=256)


Run = tuple[dict[str, list[int]], dict[str, list[str]], list[dict[str, int]], int]


def _run(engine: LLMEngine, scope: Literal["request", "batch"], gamma: int = 3) -> Run:
    """Greedy outputs, each request's drafter at each step, the steps' drafter shares, and
    the drafts accepted, for the four requests together."""
    table = [(ALL_BATCHES, gamma)]
    apply_decision(
        engine, Decision(version=1, policy="t", gamma_table=table, drafter=PROSE, drafter_scope=scope)
    )
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    tok = engine.tokenizer
    for rid, text in PROMPTS.items():
        engine.add_request(EngineRequest(rid, tok.encode(text), params))
    out: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    used: dict[str, list[str]] = {rid: [] for rid in PROMPTS}
    shares: list[dict[str, int]] = []
    accepted = 0
    for _ in range(10 * NEW):
        if not engine.has_unfinished():
            break
        result = engine.step()
        engine.check_integrity()
        accepted += result.stats.accepted
        if result.stats.drafter_shares:
            shares.append(result.stats.drafter_shares)
        for rid, seq in engine._seqs.items():
            if seq.drafter_choice is not None:
                used[rid].append(seq.drafter_choice.current)
        for o in result.outputs:
            out[o.request_id] += o.new_token_ids
    assert not engine.has_unfinished()
    return out, used, shares, accepted


def test_a_mixed_batch_drafts_each_request_with_its_own_drafter_and_stays_exact() -> None:
    engine = _engine()
    reference, _, _, _ = _run(engine, "batch", gamma=0)
    got, used, shares, accepted = _run(engine, "request")
    assert got == reference  # the target's output alone, token for token
    for rid, trail in used.items():
        want = CODE if rid.startswith("code") else PROSE
        assert trail and trail[-1] == want, (rid, trail)
        assert trail.count(want) > len(trail) // 2, (rid, trail)  # it got there early
    assert any(s == {CODE: 2, PROSE: 2} for s in shares), shares  # both drafters in one step
    batch_got, batch_used, batch_shares, batch_accepted = _run(engine, "batch")
    assert batch_got == reference
    assert not any(batch_used.values()) and all(len(s) == 1 for s in batch_shares)
    assert accepted > batch_accepted, (accepted, batch_accepted)


def test_in_per_request_scope_only_resuming_speculation_is_a_switch_cost() -> None:
    """A request that arrives while speculation runs costs its drafter a prompt catch-up at
    the next step: part of that step's time (only speculating pays it), no SwitchCostEvent.
    After a stretch of γ = 0 the first speculative step reports its catch-up as one."""
    engine = _engine()
    reference, _, _, _ = _run(engine, "batch", gamma=0)
    tok = engine.tokenizer
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    out: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    later = ["story-1", "code-1"]

    def step(version: int, gamma: int) -> StepStats:
        apply_decision(engine,
            Decision(version=version, policy="t", gamma_table=[(ALL_BATCHES, gamma)], drafter=PROSE,
                     drafter_scope="request")
        )  # fmt: skip
        result = engine.step()
        for o in result.outputs:
            out[o.request_id] += o.new_token_ids
        return result.stats

    for rid in PROMPTS:
        if rid not in later:
            engine.add_request(EngineRequest(rid, tok.encode(PROMPTS[rid]), params))
    stats = [step(v, 2) for v in range(1, 5)]  # prefill, then speculation from the start
    assert all(s.gamma == 2 for s in stats[1:])
    for rid in later:  # arrivals while speculation runs
        engine.add_request(EngineRequest(rid, tok.encode(PROMPTS[rid]), params))
    stats = [step(v, 2) for v in range(5, 9)]
    drafted = [s for s in stats if s.gamma == 2 and s.batch_size == 4]
    assert drafted and not any(s.switch_costs for s in stats), [s.switch_costs for s in stats]
    for v in range(9, 15):  # a γ = 0 stretch, then speculation resumes
        step(v, 0)
    resumed = step(15, 2)
    assert resumed.gamma == 2 and resumed.switch_costs
    assert sum(e.tokens for e in resumed.switch_costs) > 0
    v = 16
    while engine.has_unfinished():
        step(v, 2)
        v += 1
    assert out == reference  # the target's output alone


def test_a_drafter_few_sequences_use_costs_them_the_whole_step() -> None:
    """A draft forward is paid by the step, not by the sequences drafting with it: a drafter
    used by n of B sequences weighs B/n times its cost (one more user for a drafter a
    sequence would switch to), so at batch 4 one sequence alone on a model drafter does not
    pay its own way where n-gram serves the other three."""
    from collections import Counter

    from shared.experts import drafter_speed
    from worker.engine.spec.router import shared_costs

    costs = {"ngram": 0.003, "prose": 0.3}
    groups = Counter({"ngram": 3, "prose": 1})
    assert shared_costs(costs, groups, "ngram", 4) == {"ngram": 0.003 * 4 / 3, "prose": 0.3 * 4 / 2}
    assert shared_costs(costs, groups, "prose", 4) == {"ngram": 0.003 * 1, "prose": 0.3 * 4}
    assert shared_costs(costs, Counter({"prose": 4}), "prose", 4)["prose"] == pytest.approx(0.3)
    # a story where prose's first guess is right 70 % of the time, n-gram's 20 %: alone at
    # batch 4 prose is slower than n-gram, which it beats at its plain per-step cost
    alone = shared_costs(costs, groups, "prose", 4)
    assert drafter_speed(0.7, 3, 0.3) > drafter_speed(0.2, 3, 0.003)
    assert drafter_speed(0.7, 3, alone["prose"]) < drafter_speed(0.2, 3, alone["ngram"])


def test_a_batch_started_on_ngram_moves_to_the_drafter_every_sequence_favours() -> None:
    """Costs are shared among the sequences whose own rates favour a drafter, not among those
    drafting with it now. Four chat sequences start on n-gram (right 0.1 of the time); the
    head is right 0.5 of the time at 0.05 of a target step a draft. Counted by current use,
    the first sequence to switch would bear the head's whole forward (0.2) and none ever did
    (SmolLM2 at 4 chat users, 2026-12-03: 80 % stayed on n-gram); counted by preference, all
    four favour the head, share its forward and move to it. One sequence alone favouring an
    expensive drafter still stays put (the case shared costs exist for)."""
    from collections import Counter

    from worker.engine.spec.router import shared_costs

    costs = {"ngram": 0.0, "head": 0.05}
    seqs = [DrafterChoice(ExpertLearner("normalhedge", 1.0), "ngram") for _ in range(4)]
    for _ in range(12):
        prefs = [c.preferred(2, costs) for c in seqs]
        groups = Counter(prefs)
        for c, pref in zip(seqs, prefs, strict=True):
            c.learn({"ngram": (0.1, 1), "head": (1.0, 2)}, 2, shared_costs(costs, groups, pref, 4))
    assert [c.current for c in seqs] == ["head"] * 4
    # the same feedback, grouped by current use: every sequence stays on n-gram
    stuck = [DrafterChoice(ExpertLearner("normalhedge", 1.0), "ngram") for _ in range(4)]
    for _ in range(12):
        groups = Counter(c.current for c in stuck)
        for c in stuck:
            c.learn({"ngram": (0.1, 1), "head": (1.0, 2)}, 2, shared_costs(costs, groups, c.current, 4))
    assert [c.current for c in stuck] == ["ngram"] * 4
    # one sequence of four favouring a drafter that costs 0.3 a draft does not move alone
    prose = {"ngram": 0.0, "prose": 0.3}
    lone = DrafterChoice(ExpertLearner("normalhedge", 1.0), "ngram")
    for _ in range(12):
        pref = lone.preferred(3, prose)
        groups = Counter([pref, "ngram", "ngram", "ngram"])
        lone.learn({"ngram": (0.0, 1), "prose": (2.1, 3)}, 3, shared_costs(prose, groups, pref, 4))
    assert lone.preferred(3, prose) == "prose" and lone.current == "ngram"


def test_a_new_sequence_prefers_its_current_drafter_until_it_has_rates() -> None:
    c = DrafterChoice(ExpertLearner("normalhedge", 1.0), "ngram")
    assert c.preferred(2, {"head": 0.0}) == "ngram"
    c.learn({"ngram": (0.0, 2), "head": (2.0, 2)})
    assert c.preferred(2, {"head": 0.0, "ngram": 0.0}) == "head"
    assert c.preferred(0, {}) == c.current
