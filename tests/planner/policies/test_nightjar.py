"""nightjar (planner/policies/nightjar.py): the cost rule's step costs and acceptance priors.

A synthetic profile whose verify forward is nearly free at batch 1 and compute-bound from
batch 16 (SmolLM2's shape on this CPU, docs/benchmarks/history): the decision predicts every (drafter,
γ) at batch sizes 1..32, served steps calibrate it, the workers' acceptance moves the priors,
and the published description (γ per bucket) speculates at low load only.
"""

from __future__ import annotations

import math

import pytest

from planner.policies import registry
from planner.policies.nightjar import NightjarPolicy
from planner.policies.served import KNOWN_STEPS
from shared.control import ALL_BATCHES, SwitchCostEvent, Telemetry
from shared.profile import CostProfile

BATCHES = [1, 2, 4, 8, 16, 32]
ROWS = [1, 2, 3, 4, 5]


def _profile() -> CostProfile:
    """Plain step 50 ms at batch 1 growing to 250 ms at 32; q rows cost 2 % more a row at
    batch 1 and 60 % more a row from batch 16; a head drafts in 3 ms, n-gram in 50 µs."""
    target = []
    for b in BATCHES:
        plain = 0.05 + 0.2 * (b - 1) / 31
        slope = 0.02 if b <= 2 else (0.2 if b <= 8 else 0.6)
        target.append([plain * (1 + slope * (q - 1)) for q in ROWS])
    return CostProfile(
        model="fake", batches=BATCHES, rows=ROWS, target_s=target, source="test",
        drafter_s={"head": [0.003 * (1 + b / 8) for b in BATCHES], "ngram": [0.00005] * len(BATCHES)},
        catch_up_s={"head": [0.0001] * len(BATCHES)},
    )  # fmt: skip


def _policy(**kw: object) -> NightjarPolicy:
    pol = registry.create("nightjar", offload=False, **kw)
    assert isinstance(pol, NightjarPolicy)
    return pol


def _profiled(**kw: object) -> tuple[NightjarPolicy, CostProfile]:
    """A policy with the synthetic profile, and that profile."""
    pol = _policy(**kw)
    profile = _profile()
    pol.use_profile(profile)
    return pol, profile


def _assert_round_trips(pol: NightjarPolicy) -> None:
    """A policy restored from ``pol``'s state decides exactly as ``pol`` does."""
    restored = _policy()
    restored.load_state_dict(pol.state_dict())
    restored.use_profile(_profile())
    assert restored.decide(0.0).step_costs == pol.decide(0.0).step_costs


def _step(batch: int, step_time: float, gamma: int = 0, **kw: object) -> Telemetry:
    return Telemetry(
        worker_id="w", batch_size=batch, num_tokens=batch, step_time=step_time, gamma=gamma,
        mean_context=100.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_without_a_profile_it_decodes_plainly() -> None:
    choice = _policy().decide(0.0)
    assert choice.gamma_table == [(ALL_BATCHES, 0)] and not choice.step_costs
    assert "no cost profile" in choice.note


def test_it_predicts_every_pair_at_every_batch_size_and_speculates_at_low_load_only() -> None:
    pol = _policy()
    pol.use_profile(_profile())
    choice = pol.decide(0.0)
    assert [c.batch for c in choice.step_costs] == BATCHES
    c1 = choice.step_costs[0]
    assert c1.plain_s == pytest.approx(0.05)
    assert set(c1.spec_s) == {"head", "ngram"} and len(c1.spec_s["head"]) == 4
    assert c1.spec_s["head"][1] == pytest.approx(2 * 0.003 * (1 + 1 / 8) + 0.05 * 1.04)  # γ = 2
    # the description: at the prior acceptance (0.5) γ > 0 pays at batch 1, not from 16 on
    table = dict(choice.gamma_table)
    assert table[1] > 0 and table[16] == 0 and table[ALL_BATCHES] == 0
    assert choice.drafter_scope == "request" and choice.acceptance == {"head": 0.5, "ngram": 0.5}
    assert choice.hold_by_drafter == {"head": math.ceil(64 * 0.0001 / (0.05 * 0.05)), "ngram": 1}
    assert choice.hold_steps == 3  # older workers: the dearest K


def test_served_steps_calibrate_the_profile_by_batch_class() -> None:
    """Plain steps at 16 sequences served at 1.5× the profile: the plain cost there grows to
    about 1.5×, and speculative ones take that ratio until their own steps are seen; a class
    without steps of its own takes what the class seen most serves beyond its profile."""
    pol = _policy()
    pol.use_profile(_profile())
    predicted = pol.profile.target(16, 1, 100.0) if pol.profile else 0.0
    for _ in range(200):
        pol.observe(_step(16, 1.5 * predicted))
    costs = {c.batch: c for c in pol.decide(0.0).step_costs}
    assert costs[16].plain_s == pytest.approx(1.5 * predicted, rel=0.02)
    assert costs[16].spec_s["head"][0] > 1.4 * pol.profile.target(16, 2, 100.0)  # type: ignore[union-attr]
    # no batch-1 step yet: what the class seen most serves beyond its profile, in seconds
    assert costs[1].plain_s == pytest.approx(0.05 + 0.5 * predicted)
    for _ in range(200):
        pol.observe(_step(1, 0.05))
    assert pol.decide(0.0).step_costs[0].plain_s == pytest.approx(0.05, rel=0.02)  # then its own
    # a speculative class seen at its own ratio
    for _ in range(200):
        pol.observe(_step(1, 0.06, gamma=2, proposed=2, num_drafts=1, drafter_shares={"head": 1}))
    c1 = {c.batch: c for c in pol.decide(0.0).step_costs}[1]
    assert c1.spec_s["head"][1] == pytest.approx(0.06, rel=0.05)


def test_each_drafter_is_priced_at_its_own_served_excess() -> None:
    """At one sequence, head steps serve 1.3× their profiled time (a head's catch-up on the
    tokens it did not draft, which the profile's draft steps leave out) and n-gram steps 1.0×:
    each is priced at its own, not at the mean of both; a drafter not yet seen takes the
    class's excess of every speculative step."""
    pol = _policy()
    pol.use_profile(_profile())
    prof = pol.profile
    assert prof is not None
    for _ in range(200):
        pol.observe(_step(1, 0.05))
    head2 = 2 * prof.draft(1, "head") + prof.target(1, 3, 100.0)
    ngram2 = 2 * prof.draft(1, "ngram") + prof.target(1, 3, 100.0)
    for _ in range(200):
        pol.observe(_step(1, 1.3 * head2, gamma=2, proposed=2, num_drafts=1, drafter_shares={"head": 1}))
        pol.observe(_step(1, ngram2, gamma=2, proposed=2, num_drafts=1, drafter_shares={"ngram": 1}))
    c1 = pol.decide(0.0).step_costs[0]
    assert c1.spec_s["head"][1] == pytest.approx(1.3 * head2, rel=0.03)
    assert c1.spec_s["ngram"][1] == pytest.approx(ngram2, rel=0.03)
    shared = pol.served.spec_excess[1]
    assert 1.05 < shared < 1.25  # every speculative step's: what a new drafter starts from
    _assert_round_trips(pol)
    one = _policy(own_excess=False)  # the A/B switch: one excess for every drafter, as before
    one.load_state_dict(pol.state_dict())
    one.use_profile(_profile())
    c1 = one.decide(0.0).step_costs[0]
    assert c1.spec_s["head"][1] / head2 == pytest.approx(c1.spec_s["ngram"][1] / ngram2, rel=1e-6)


def test_acceptance_is_learnt_from_what_the_workers_verify() -> None:
    pol = _policy()
    pol.use_profile(_profile())
    for _ in range(300):
        pol.observe(_step(1, 0.05, gamma=2, proposed=2, num_drafts=1, drafter_shares={"head": 1},
                          counterfactual={"head": 0.8, "ngram": 0.1}))  # fmt: skip
    choice = pol.decide(0.0)
    assert choice.acceptance["head"] == pytest.approx(0.8, abs=0.02)
    assert choice.acceptance["ngram"] == pytest.approx(0.1, abs=0.02)
    assert choice.acceptance["head"] < choice.acceptance_hi["head"] < 0.9
    assert choice.drafter == "head"


def test_a_catch_up_is_no_step_cost_and_the_state_round_trips() -> None:
    pol = _policy()
    pol.use_profile(_profile())
    ev = SwitchCostEvent(drafter="head", batch_size=1, tokens=64, seconds=0.5)
    for _ in range(50):
        pol.observe(_step(1, 0.05 + 0.5, switch_costs=[ev]))
    assert pol.served.ratio_plain[1] == pytest.approx(1.0, rel=0.05)
    _assert_round_trips(pol)


def test_the_decision_shows_in_the_planners_gauges_and_in_top() -> None:
    from planner.metrics import PlannerMetrics
    from shared.control import Decision
    from shared.overview import Snapshot, render

    pol = _policy()
    pol.use_profile(_profile())
    c = pol.decide(0.0)
    d = Decision(version=3, policy="nightjar", gamma_table=c.gamma_table, step_costs=c.step_costs,
                 acceptance={"head": 0.42, "ngram": 0.1}, hold_steps=c.hold_steps)  # fmt: skip
    metrics = PlannerMetrics()
    metrics.on_publish(d)
    assert metrics.acceptance.labels(drafter="head")._value.get() == pytest.approx(0.42)
    text = render(
        Snapshot(at=d.created_at, workers=[], decision=d, active=None, status={}, pending=0, lag=0, tail=0)
    )
    assert f"cost rule acceptance prior  head 0.42  ngram 0.10  hold {c.hold_steps} steps" in text


def test_scoring_time_and_one_slow_speculative_step_do_not_price_speculation_out() -> None:
    """A speculative step's scoring of new prompts (``counterfactual_time``) is not what its γ
    cost, and one slow speculative step moves the class's excess by a twentieth at most: on
    SmolLM2 one warm-up step that scored two prompts (108 ms against 49 predicted) once priced
    speculation out at every batch size for the rest of the run."""
    pol, p = _profiled()
    for b in (1, 4):
        for _ in range(50):
            pol.observe(_step(b, p.target(b, 1, 100.0)))
    before = {c.batch: c.spec_s["head"] for c in pol.decide(0.0).step_costs}
    predicted = p.target(4, 2, 100.0) + 2 * p.draft(4, "head")
    spec = {"gamma": 2, "proposed": 8, "num_drafts": 4, "drafter_shares": {"head": 4}}
    pol.observe(_step(4, 2.2 * predicted, counterfactual_time=1.2 * predicted, **spec))
    after = {c.batch: c.spec_s["head"] for c in pol.decide(0.0).step_costs}
    plain4 = {c.batch: c.plain_s for c in pol.decide(0.0).step_costs}[4]
    # the scoring is charged to speculation at its class, a twentieth of one plain step at most
    assert after[4] == pytest.approx([b + 0.05 * plain4 for b in before[4]], rel=0.01)
    assert after[1] == pytest.approx(before[1], rel=0.01)
    pol.observe(_step(4, 5.0 * predicted, **spec))  # slow for a reason the step does not show
    after = {c.batch: c.spec_s["head"] for c in pol.decide(0.0).step_costs}
    assert after[1][0] <= before[1][0] * 1.051  # at most 5 % of the clipped 2×
    for _ in range(200):  # many slow steps are believed
        pol.observe(_step(4, 1.5 * predicted, **spec))
    assert {c.batch: c for c in pol.decide(0.0).step_costs}[4].spec_s["head"][1] == pytest.approx(
        1.5 * predicted, rel=0.03
    )


def test_ngrams_acceptance_comes_from_its_lookahead_at_every_step() -> None:
    """n-gram is judged on every step's text (the worker's lookahead): its prior is those runs
    counted per token (a run a < depth judges a + 1 positions), not the few sparse scores."""
    from shared.control import Lookahead

    pol = _policy()
    pol.use_profile(_profile())
    runs = Lookahead(accepted=[1, 0, 0, 0, 1], proposed=[0, 0, 0, 0, 2])  # nothing, or all four
    for _ in range(100):
        pol.observe(_step(1, 0.05, counterfactual={"ngram": 0.0}, lookahead={"ngram": runs}))
    mean, _ = pol.priors()
    assert mean["ngram"] == pytest.approx(4 / 5, abs=0.02)  # 4 accepted of 5 judged per pair


def test_each_drafter_holds_for_its_own_switching_cost() -> None:
    """K per drafter from its own catch-up: a head that catches up at 1 ms a token holds more
    steps than n-gram, which catches up on nothing and holds the least."""
    prof = _profile().model_copy(update={"catch_up_s": {"head": [0.001] * len(BATCHES)}})
    pol = _policy(hold_min=4, hold_max=64)
    pol.use_profile(prof)
    by = pol.hold_by_drafter()
    assert by["ngram"] == 4
    assert by["head"] == math.ceil(64 * 0.001 / (0.05 * 0.05)) == 26  # 64 tokens ≤ 5 % of K plain steps
    choice = pol.decide(0.0)
    assert choice.hold_by_drafter == by and choice.hold_steps == 26
    assert choice.hold_tokens == 64  # K is for that catch-up: the workers scale it by the lag


def test_by_default_a_sequence_takes_ngram_or_plain_decoding_at_once_and_a_head_after_its_k() -> None:
    """n-gram and plain decoding catch up on nothing: by default their K is 1, so a sequence
    on a head takes n-gram's run the step it appears (runs on code come and go within 4
    steps); a head still waits the K its catch-up amortises."""
    prof = _profile().model_copy(update={"catch_up_s": {"head": [0.001] * len(BATCHES)}})
    pol = _policy()
    pol.use_profile(prof)
    assert pol.hold_by_drafter() == {"head": 26, "ngram": 1}


def test_the_services_time_between_steps_is_part_of_every_step_as_served() -> None:
    """``gap_time`` (the worker's writes, telemetry, intake between steps) is added to a plain
    step and to every speculative one, per batch class: a speculative class takes the plain
    gap until its own steps are seen, and the gap survives a restart of the planner."""
    pol = _policy()
    pol.use_profile(_profile())
    before = pol.decide(0.0).step_costs[0]
    for _ in range(300):
        pol.observe(_step(1, 0.05, gap_time=0.01))
    c1 = pol.decide(0.0).step_costs[0]
    assert c1.plain_s == pytest.approx(before.plain_s + 0.01, rel=0.01)
    assert c1.spec_s["head"][1] == pytest.approx(before.spec_s["head"][1] + 0.01, rel=0.02)
    for _ in range(300):
        pol.observe(
            _step(1, 0.05, gamma=2, proposed=2, num_drafts=1, drafter_shares={"ngram": 1}, gap_time=0.02)
        )
    c1 = pol.decide(0.0).step_costs[0]
    assert c1.plain_s == pytest.approx(before.plain_s + 0.01, rel=0.01)
    assert c1.spec_s["ngram"][0] - pol.step_costs()[0].plain_s > 0.005  # its own, larger gap
    again = _policy()
    again.use_profile(_profile())
    again.load_state_dict(pol.state_dict())
    assert again.step_costs() == pol.step_costs()


def test_a_drafter_left_out_of_the_scores_while_others_draft_is_let_back_in() -> None:
    """The head's prior fell to 0.1 on text it did not fit (its plausible highest too low to
    pay, so the workers stop scoring it). While n-gram drafts without scoring it, after
    ``UNSCORED_STEPS`` its counts fade — its mean kept, its bound rising — until the bound
    says it could pay again and the workers score it; steps where nothing drafts fade nothing
    (a busy batch: a risen bound would bring back work at γ = 0), and a scored drafter keeps
    its counts."""
    from planner.policies.nightjar import UNSCORED_STEPS

    pol = _policy()
    pol.use_profile(_profile())
    for _ in range(300):
        pol.observe(_step(1, 0.05, gamma=2, proposed=2, num_drafts=1, drafter_shares={"head": 1},
                          counterfactual={"head": 0.1}))  # fmt: skip
    low = pol.decide(0.0).acceptance_hi["head"]
    assert low < 0.2
    for _ in range(500):  # a busy phase: γ = 0, nothing drafted, nothing scored
        pol.observe(_step(16, 0.2))
    assert pol.decide(0.0).acceptance_hi["head"] == pytest.approx(low)
    ngram = {"gamma": 2, "proposed": 2, "num_drafts": 1, "drafter_shares": {"ngram": 1}}
    for _ in range(UNSCORED_STEPS):
        pol.observe(_step(1, 0.05, counterfactual={"ngram": 0.5}, **ngram))
    assert pol.decide(0.0).acceptance_hi["head"] == pytest.approx(low)  # not yet
    for _ in range(1000):
        pol.observe(_step(1, 0.05, counterfactual={"ngram": 0.5}, **ngram))
    choice = pol.decide(0.0)
    assert choice.acceptance["head"] == pytest.approx(0.1, abs=0.01)  # the mean is kept
    assert choice.acceptance_hi["head"] > 0.3
    beta = pol.acceptance["head"]
    assert beta.a + beta.b == pytest.approx(2.0, rel=0.01)  # down to two positions, no further
    before = pol.acceptance["ngram"].a + pol.acceptance["ngram"].b
    assert before > 20  # n-gram, scored at every step, keeps its counts


def test_speculation_is_charged_its_scoring_and_an_unseen_class_takes_no_discount() -> None:
    """Speculative steps at 32 sequences that spend a fifth of a plain step scoring new
    prompts and catching drafters up are priced with it (at their class only); an excess
    below 1 learnt at one sequence is not taken at a busier class with no speculative step of
    its own (nj-target: 0.71 at one user priced prose γ 2 at 32 users at 1.5 plain steps)."""
    pol, p = _profiled()
    for b in (1, 32):
        for _ in range(100):
            pol.observe(_step(b, p.target(b, 1, 100.0)))
    head1 = 2 * p.draft(1, "head") + p.target(1, 3, 100.0)
    for _ in range(200):  # one sequence: speculative steps served at 0.7 of their profile
        pol.observe(_step(1, 0.7 * head1, gamma=2, proposed=2, num_drafts=1, drafter_shares={"head": 1}))
    costs = {c.batch: c for c in pol.decide(0.0).step_costs}
    assert costs[1].spec_s["head"][1] == pytest.approx(0.7 * head1, rel=0.03)
    head32 = 2 * p.draft(32, "head") + p.target(32, 3, 100.0)
    assert costs[32].spec_s["head"][1] == pytest.approx(head32, rel=0.01)  # not 0.7 ×
    plain32 = costs[32].plain_s
    spec = {"gamma": 2, "proposed": 64, "num_drafts": 32, "drafter_shares": {"head": 32}}
    for _ in range(200):
        pol.observe(_step(32, head32 + 0.2 * plain32, counterfactual_time=0.2 * plain32, **spec))
    costs = {c.batch: c for c in pol.decide(0.0).step_costs}
    assert costs[32].spec_s["head"][1] == pytest.approx(head32 + 0.2 * plain32, rel=0.02)
    assert costs[32].plain_s == pytest.approx(plain32, rel=1e-6)
    assert costs[1].spec_s["head"][1] == pytest.approx(0.7 * head1, rel=0.03)  # not its class
    assert dict(pol.decide(0.0).gamma_table)[ALL_BATCHES] == 0
    _assert_round_trips(pol)
    free = _policy(charge_scoring=False)  # the A/B switch
    free.load_state_dict(pol.state_dict())
    free.use_profile(_profile())
    c32 = {c.batch: c for c in free.decide(0.0).step_costs}[32]
    assert c32.spec_s["head"][1] == pytest.approx(head32, rel=0.02)


def test_a_class_without_plain_steps_is_priced_at_the_known_overhead_in_seconds() -> None:
    """Plain steps at one sequence serve at 2× a 50 ms profile (50 ms beyond it): at 32
    sequences, where no plain step ran, a plain step is priced at its profile plus those
    50 ms, not at 2×. One slow step there (a ramp step) moves the class's own ratio by a
    twentieth; after ``KNOWN_STEPS`` it is the class's own, and its speculative steps keep the
    price they served at. Taken as a ratio, nj-target's one-user plain steps (4.7× a 1.6 ms
    profile) priced plain decoding at 32 at twice its cost: nightjar speculated on every step
    there, and no plain step ran to correct it."""
    pol, p = _profiled()
    p1, p32 = p.target(1, 1, 100.0), p.target(32, 1, 100.0)
    for _ in range(100):
        pol.observe(_step(1, 2.0 * p1))
    costs = {c.batch: c for c in pol.decide(0.0).step_costs}
    assert costs[32].plain_s == pytest.approx(p32 + p1)
    head32 = 2 * p.draft(32, "head") + p.target(32, 3, 100.0)
    spec = {"gamma": 2, "proposed": 64, "num_drafts": 32, "drafter_shares": {"head": 32}}
    for _ in range(300):  # speculative steps at 32 are priced at what they serve at
        pol.observe(_step(32, 1.3 * head32, **spec))
    priced = {c.batch: c for c in pol.decide(0.0).step_costs}[32].spec_s["head"][1]
    assert priced == pytest.approx(1.3 * head32, rel=0.02)
    carried = 1.0 + p1 / p32
    pol.observe(_step(32, 4.0 * p32))
    assert pol.served.ratio_plain[6] == pytest.approx(carried + 0.05 * (4.0 - carried))
    for _ in range(KNOWN_STEPS - 1):
        pol.observe(_step(32, 1.8 * p32))
    costs = {c.batch: c for c in pol.decide(0.0).step_costs}
    assert costs[32].plain_s == pytest.approx(pol.served.ratio_plain[6] * p32)  # its own now
    assert costs[32].spec_s["head"][1] == pytest.approx(priced, rel=1e-6)  # unmoved by it
    _assert_round_trips(pol)
