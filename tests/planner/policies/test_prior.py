"""The cost profile as prior: predictions, intervals, and γ per bucket without exploring."""

from __future__ import annotations

from typing import Any

import pytest

from planner.baselines.cost_model import CostModelPolicy
from planner.policies import registry
from planner.policies.bandit import BanditPolicy
from planner.policies.bingreedy import BinGreedy, Interval
from planner.policies.prior import Beta, ProfilePrior, arm_intervals, expected_tokens
from planner.sim import Runner, Scenario, SimWorker
from planner.sim.curves import CostCurves
from planner.sim.scenario import Phase
from shared.control import Telemetry
from shared.profile import CostProfile

BATCHES = [1, 4, 16, 64]
ALPHA = 0.8
PLAIN: dict[str, Any] = {"offload": False, "drafter_policy": "fixed"}


def fake_profile() -> CostProfile:
    """A made-up cost surface with clear winners: a target pass costs the same for every
    q up to a cliff (a kernel's tile filled) and four times as much past it; the cliff
    comes earlier as the batch grows, so with α = 0.8 the best γ is the last before it
    (4, 3, 1, 0 at batch 1, 4, 16, 64), every other γ at least 10 % worse."""
    rows, cliff = [1, 2, 3, 4, 5], {1: 5, 4: 4, 16: 2, 64: 1}
    target = [[(0.010 + 0.0005 * b) * (1 if q <= cliff[b] else 4) for q in rows] for b in BATCHES]
    return CostProfile(
        model="fake", batches=BATCHES, rows=rows, target_s=target,
        drafter_s={"d": [0.0002 + 0.00001 * b for b in BATCHES]}, source="test",
    )  # fmt: skip


def scenario(profile: CostProfile) -> Scenario:
    return Scenario(
        phases=[Phase(60, b) for b in BATCHES],
        acceptance={"d": {"default": ALPHA}},
        curves=CostCurves.from_profile(profile, "d"),
    )


def test_expected_tokens_and_beta() -> None:
    assert expected_tokens(0.0, 3) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    beta = Beta()
    for _ in range(200):
        beta.add(0.7, 10.0, 0.98)
    lo, hi = beta.bounds(2.0)
    assert lo < 0.7 < hi and hi - lo < 0.1  # about 500 positions remembered (λ = 0.98)
    assert Beta().bounds(2.0) == (0.0, 1.0)
    prior = ProfilePrior()
    prior.acceptance["d"] = beta
    for step in range(3000):  # speculation off: α becomes uncertain again
        prior.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=4, step_time=0.01))
    lo, hi = prior.acceptance["d"].bounds(2.0)
    assert lo < 0.3 and hi > 0.95  # as unsure as the uniform prior


def test_prediction_follows_profile_and_acceptance() -> None:
    prior = ProfilePrior()
    assert prior.predict(4, 2) is None  # no profile yet
    prior.use(fake_profile())
    plain = prior.predict(4, 0)
    assert plain is not None and plain.mean == pytest.approx(0.010 + 0.0005 * 4)
    wide = prior.predict(4, 2, "d")
    assert wide is not None and wide.lo < wide.mean < wide.hi
    for step in range(50):
        prior.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=8, step_time=0.01,
                                gamma=2, drafter="x", proposed=8, accepted=4, num_drafts=4,
                                counterfactual={"d": ALPHA}))  # fmt: skip
    narrow = prior.predict(4, 2, "d")
    assert narrow is not None and narrow.hi - narrow.lo < 0.3 * (wide.hi - wide.lo)
    seconds = 2 * (0.0002 + 0.00001 * 4) + 0.010 + 0.0005 * 4
    assert narrow.mean == pytest.approx(seconds / expected_tokens(prior.acceptance["d"].mean, 2))
    assert prior.predict(4, 5, "d") is None  # beyond the rows measured


def test_arm_intervals_calibrate_by_measured_arms() -> None:
    prior = ProfilePrior()
    prior.use(fake_profile())
    bandit = BinGreedy(3)
    plain = prior.predict(1, 0)
    assert plain is not None
    for _ in range(10):  # γ = 0 runs 1.5 times slower than profiled
        bandit.record(0, 1.5 * plain.mean, 1.0)
    ivs = arm_intervals(prior, bandit, 1, "d")
    assert ivs is not None and ivs[0] is not None and ivs[0].mean == pytest.approx(1.5 * plain.mean)
    predicted = prior.predict(1, 2, "d")
    assert predicted is not None and ivs[2] is not None
    # one context profiled: what serving adds (mostly its longer context) grows with the rows
    want = (1.5 * predicted.mean, 1.5 * predicted.lo, 1.5 * predicted.hi)
    assert (ivs[2].mean, ivs[2].lo, ivs[2].hi) == pytest.approx(want)
    two = fake_profile()
    prior.use(two.model_copy(update={"context": 30.0, "long_context": 140.0, "long_target_s": two.target_s}))
    ivs = arm_intervals(prior, bandit, 1, "d")
    predicted, step = prior.predict(1, 2, "d"), prior.step(1, 2, "d")
    assert ivs is not None and ivs[2] is not None and predicted is not None and step is not None
    k = (step + 0.5 * plain.mean) / step  # two contexts: the same seconds added to γ = 2's step
    assert 1.0 < k < 1.5
    want = (k * predicted.mean, k * predicted.lo, k * predicted.hi)
    assert (ivs[2].mean, ivs[2].lo, ivs[2].hi) == pytest.approx(want)


def test_overlap_limits_exploration() -> None:
    b = BinGreedy(3)
    apart = [Interval(1.0, 0.9, 1.1), Interval(2.0, 1.8, 2.2), Interval(3.0, 2.9, 3.1)]
    assert b.overlapping(apart) == (0, [0])
    near = [Interval(1.0, 0.9, 1.1), Interval(1.05, 0.95, 1.15), Interval(3.0, 2.9, 3.1)]
    assert b.overlapping(near) == (0, [0, 1])
    assert b.overlapping([None, *apart[1:]]) == (0, [0, 1])  # an unknown arm: tried first


def _run(profile: CostProfile | None, steps: int, seed: int = 0) -> tuple[BanditPolicy, Runner]:
    pol = registry.create("bandit", seed=seed, **PLAIN)
    assert isinstance(pol, BanditPolicy)
    if profile is not None:
        pol.use_profile(profile)
    runner = Runner(pol, SimWorker(scenario(fake_profile()), seed=seed))
    runner.run(steps)
    return pol, runner


def test_profile_prior_picks_gamma_per_bucket_without_exploring() -> None:
    profile = fake_profile()
    sc = scenario(profile)
    optimum = {b: sc.optimal_gamma(b, 4, "d", "default") for b in BATCHES}
    assert optimum == {1: 4, 4: 3, 16: 1, 64: 0}
    with_prior: list[int] = []
    without: list[int] = []
    for seed in range(3):
        pol, runner = _run(profile, 1200, seed)
        for b in BATCHES:
            bandit = pol.bandits[pol.buckets.index(b)]
            assert bandit.arm == optimum[b], (seed, b, bandit.arm, optimum[b])
        tail = range(600, 1200)  # the second half runs the optimum at every step
        assert all(runner.trace.gamma[i] == runner.trace.optimal[i] for i in tail), seed
        visited = [pol.buckets.index(b) for b in BATCHES]
        with_prior.append(sum(pol.bandits[i].explore_bins for i in visited))
        bare, _ = _run(None, 1200, seed)
        without.append(sum(bare.bandits[i].explore_bins for i in visited))
    print(f"exploration bins over 1200 steps, 3 seeds: with the profile {with_prior}, without {without}")
    # α is unknown until speculation has run: the first bins overlap (a few per bucket),
    # later ones do not — the second half above ran the optimum throughout
    assert max(with_prior) <= 12
    assert sum(with_prior) * 5 <= sum(without)


def test_cost_model_uses_the_profile_and_probes_only_overlapping_lengths() -> None:
    profile = fake_profile()
    sc = scenario(profile)
    probes = {}
    for with_profile in (True, False):
        pol = registry.create("cost-model", gamma_max=4, alpha_prior=ALPHA, probe_every=20)
        assert isinstance(pol, CostModelPolicy)
        if with_profile:
            pol.use_profile(profile)
            for b in BATCHES:  # right from the start, before anything is measured
                lat = {k: sc.expected_latency(b, k, "d", "default") for k in pol.lengths}
                assert pol.best_length(pol.buckets.index(b)) == min(lat, key=lat.__getitem__), b
        Runner(pol, SimWorker(sc, seed=0)).run(1200)
        probes[with_profile] = pol.probes
    print(f"cost-model probes of another length over 1200 steps: with the profile {probes[True]}, "
          f"without {probes[False]}")  # fmt: skip
    assert probes[True] * 4 <= probes[False]


def test_switch_cost_starts_from_the_profiled_catch_up() -> None:
    profile = fake_profile().model_copy(update={"catch_up_s": {"d": [1e-4, 2e-4, 4e-4, 8e-4]}})
    pol = registry.create("bandit", **PLAIN)
    assert isinstance(pol, BanditPolicy)
    before = pol.switch.cost("d", 100, 4)
    pol.use_profile(profile)
    assert pol.switch.cost("d", 100, 4) == pytest.approx(100 * 2e-4) != pytest.approx(before)


def test_what_only_speculation_costs_is_learned_and_added_to_its_predictions() -> None:
    """The profile models forwards only; a speculative step's scoring and bookkeeping (its
    ``other_time`` beyond a plain step's, catch-ups charged as C_switch excluded) is learned
    per batch class and added to every γ > 0 prediction, so a γ the profile alone favours
    loses to plain decoding once the steps show what it really costs."""
    from shared.control import SwitchCostEvent

    prior = ProfilePrior()
    prior.use(fake_profile())
    prior.acceptance["d"] = Beta(20.0, 80.0)  # α ≈ 0.2
    bandit = BinGreedy(3)
    before = arm_intervals(prior, bandit, 4, "d")
    assert before is not None and before[1] is not None and before[0] is not None
    assert before[1].mean < before[0].mean  # the profile alone: γ = 1 pays at batch 4
    for step in range(100):
        prior.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=4, step_time=0.012,
                                other_time=0.0002))  # fmt: skip
        spec = Telemetry(
            worker_id="w",
            step=step,
            batch_size=4,
            num_tokens=5,
            step_time=0.02,
            gamma=1,
            drafter="d",
            proposed=4,
            accepted=1,
            num_drafts=4,
            other_time=0.0052,
            counterfactual={"d": 0.2},
            switch_costs=[SwitchCostEvent(drafter="d", batch_size=4, tokens=8, seconds=0.002)],
        )
        prior.observe(spec)
    assert prior.overhead.seconds(4) == pytest.approx(0.003, rel=1e-6)  # 5.2 − 2 (catch-up) − 0.2 ms
    assert prior.overhead.seconds(8) == pytest.approx(0.006, rel=1e-6)  # the nearest class, by batch
    plain, spec1 = prior.predict(4, 0), prior.predict(4, 1, "d")
    assert plain is not None and spec1 is not None
    seconds = 0.0002 + 0.00001 * 4 + 0.010 + 0.0005 * 4 + 0.003
    assert spec1.mean == pytest.approx(seconds / expected_tokens(prior.acceptance["d"].mean, 1))
    after = arm_intervals(prior, bandit, 4, "d")
    assert after is not None and after[1] is not None and after[0] is not None
    assert after[0].mean < after[1].mean  # now plain decoding wins
    restored = ProfilePrior()
    restored.load_state_dict(prior.state_dict())
    assert restored.overhead.seconds(4) == prior.overhead.seconds(4)


def _ngram_and_prose(row_cost: float, prose_s: float) -> CostProfile:
    """A 5 ms plain step, each more row ``row_cost`` of it; a free n-gram and a prose drafter."""
    batches, rows = [1, 4, 16], [1, 2, 3, 4, 5]
    return CostProfile(
        model="fake", batches=batches, rows=rows, source="test",
        target_s=[[0.005 * (1 + row_cost * (q - 1)) for q in rows] for _ in batches],
        drafter_s={"ngram": [0.00005] * 3, "prose": [prose_s] * 3},
    )  # fmt: skip


def test_the_drafter_choice_weighs_acceptance_against_the_profiled_cost() -> None:
    """n-gram accepted a third of the time but free beats a model drafter accepted twice as
    often at a fifth of a target step a draft (nj-target at 4 users: static n-gram γ = 4
    1.12× plain decoding, the prose drafter 1.00×); without a profile acceptance alone picks
    the model drafter. The costs go out with the decision for the per-request learners."""
    from shared.experts import drafter_speed

    assert drafter_speed(1.0, 4, 0.0) == 1.0 and drafter_speed(0.0, 4, 0.0) == pytest.approx(0.2)
    assert drafter_speed(0.54, 4, 0.2) < drafter_speed(0.33, 4, 0.0)
    assert drafter_speed(0.54, 4, 0.0) > drafter_speed(0.33, 4, 0.0)
    profile = _ngram_and_prose(row_cost=0.1, prose_s=0.002)

    def run(with_profile: bool) -> Any:
        policy = registry.create("bandit", offload=False)
        if with_profile:
            policy.use_profile(profile)
        for step in range(60):
            policy.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=8, step_time=0.01,
                                     gamma=4, drafter="prose", proposed=16, accepted=9, num_drafts=4,
                                     counterfactual={"prose": 0.54, "ngram": 0.33}))  # fmt: skip
        return policy.decide(0.0)

    blind, costed = run(False), run(True)
    assert blind.drafter == "prose" and blind.drafter_costs == {} and blind.skip_drafters == []
    assert costed.drafter == "ngram"
    assert costed.drafter_costs == pytest.approx({"ngram": 0.01, "prose": 0.4})
    # at two fifths of a target step a draft prose is surely slower (its predicted latency per
    # token at the top of its acceptance interval above n-gram's at the bottom): the workers
    # stop scoring it ...
    assert costed.skip_drafters == ["prose"]
    policy = registry.create("bandit", offload=False)
    policy.use_profile(profile)
    for step in range(60):
        policy.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=8, step_time=0.01,
                                 gamma=4, drafter="ngram",
                                 counterfactual={"prose": 0.54, "ngram": 0.33}))  # fmt: skip
    assert policy.decide(0.0).skip_drafters == ["prose"]
    step = 60
    while policy.decide(0.0).skip_drafters:  # ... until, unscored, its acceptance is unsure again
        policy.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=8, step_time=0.01,
                                 gamma=4, drafter="ngram", counterfactual={"ngram": 0.33}))  # fmt: skip
        step += 1
        assert step < 5000
    assert step > 200  # not at once


def test_a_drafter_is_dominated_by_what_the_prior_predicts_not_by_its_per_token_rate() -> None:
    """n-gram's per-token counterfactual (0.15) says it is slower than a model drafter accepted
    0.6 of the time; its lookahead says its hits come in runs (all four drafts right at 40 % of
    positions) and its proposals are empty half the time (one verify row), and the profile
    says rows and the model drafter's forwards cost: the prediction skips the model drafter,
    never n-gram."""
    from shared.control import Lookahead

    profile = _ngram_and_prose(row_cost=0.25, prose_s=0.001)
    policy = registry.create("bandit", offload=False)
    policy.use_profile(profile)
    la = {"ngram": Lookahead(accepted=[3, 0, 0, 0, 2], proposed=[5, 0, 0, 0, 5])}
    for step in range(60):
        policy.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=8, step_time=0.01,
                                 gamma=4, drafter="prose", proposed=16, accepted=9, num_drafts=4,
                                 counterfactual={"prose": 0.6, "ngram": 0.15}, lookahead=la))  # fmt: skip
    decision = policy.decide(0.0)
    assert decision.drafter == "ngram" and decision.skip_drafters == ["prose"]


def test_runs_give_tokens_and_rows_per_gamma() -> None:
    from planner.policies.prior import Runs
    from shared.control import Lookahead

    runs = Runs([0.0] * 5, [0.0] * 5)
    runs.add(Lookahead(accepted=[3, 0, 0, 0, 1], proposed=[2, 0, 0, 0, 2]), 0.99)
    assert runs.weight == 4 and runs.depth == 4
    hi, mean, lo = runs.tokens(4, 2.0)
    assert mean == pytest.approx(2.0) and lo < mean < hi <= 5.0  # one run of 4 in four positions
    assert runs.tokens(1, 0.0)[1] == pytest.approx(1.25)  # at γ = 1 the run counts once
    assert runs.rows(4) == pytest.approx(3.0) and runs.rows(2) == pytest.approx(2.0)


def _gamma_at(table: list[tuple[int, int]], batch: int) -> int:
    return next(g for upper, g in table if batch <= upper)


def test_lookahead_lets_bandit_speculate_with_ngram_it_never_ran() -> None:
    """n-gram's first guess is right a quarter of the time, but then it runs on for all four
    tokens, and it proposes at half the positions: E(0.25, 4) = 1.33 tokens over a full five-row
    verification says γ = 4 loses; what it really gives (2 tokens over 3 rows) wins. Judged on
    verified text at γ = 0 steps (the workers' lookahead), the prior knows that without running
    γ > 0 at all, and bandit speculates with n-gram; without the lookahead it stays at γ = 0."""
    from shared.control import Lookahead

    batches, rows = [1, 4, 16], [1, 2, 3, 4, 5]
    profile = CostProfile(
        model="fake", batches=batches, rows=rows, source="test",
        target_s=[[0.010 * (1 + 0.15 * (q - 1)) for q in rows] for _ in batches],
        drafter_s={"head": [0.001] * 3, "ngram": [0.00001] * 3},
    )  # fmt: skip

    def run(lookahead: bool) -> Any:
        policy = registry.create("bandit", offload=False)
        policy.use_profile(profile)
        la = {"ngram": Lookahead(accepted=[3, 0, 0, 0, 1], proposed=[2, 0, 0, 0, 2])} if lookahead else {}
        for step in range(200):
            policy.observe(Telemetry(worker_id="w", step=step, batch_size=4, num_tokens=4, step_time=0.010,
                                     lookahead=la))  # fmt: skip
        return policy

    policy = run(True)
    plain, spec = policy.prior.predict(4, 0), policy.prior.predict(4, 4, "ngram")
    assert plain is not None and spec is not None
    assert spec.mean == pytest.approx((4 * 0.00001 + 0.010 * 1.3) / 2.0, rel=1e-3)
    assert spec.hi < plain.lo  # surely faster
    choice = policy.decide(0.0)
    assert _gamma_at(choice.gamma_table, 4) > 0 and choice.drafter == "ngram"
    blind = run(False).decide(0.0)
    assert _gamma_at(blind.gamma_table, 4) == 0
    restored = registry.create("bandit", offload=False)
    restored.load_state_dict(policy.state_dict())
    assert restored.prior.runs["ngram"].accepted == policy.prior.runs["ngram"].accepted
