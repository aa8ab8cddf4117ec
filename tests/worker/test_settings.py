"""Failover timing: one setting, ``claim_idle_s``, and what derives from it."""

from __future__ import annotations

import pytest

from nightjar.cli import build_parser
from worker.settings import MAX_SWEEP_S, WorkerSettings, claim_timing


@pytest.mark.parametrize("claim_idle_s", [0.3, 3.0, 12.0, 30.0, 600.0])
def test_renewal_and_sweep_derive_from_claim_idle(claim_idle_s: float) -> None:
    s = WorkerSettings(model_dir="m", claim_idle_s=claim_idle_s)
    assert (s.renew_s, s.autoclaim_s) == claim_timing(claim_idle_s)
    # Three renewals fit in the claim limit: a live worker's jobs never look idle.
    assert s.renew_s * 3 == pytest.approx(claim_idle_s)
    # An orphan is idle past the limit at most claim_idle_s after its worker died and is swept
    # at most one sweep period later: within claim_idle_s + 2 s, leaving room in the promised 5 s.
    assert s.autoclaim_s <= min(MAX_SWEEP_S, claim_idle_s / 6) + 1e-9


def test_the_defaults_bound_failover_by_claim_idle_plus_two_seconds() -> None:
    s = WorkerSettings(model_dir="m")
    assert (s.claim_idle_s, s.renew_s, s.autoclaim_s) == (30.0, 10.0, 2.0)


def test_the_command_line_has_one_failover_setting() -> None:
    args = build_parser().parse_args(["worker", "--claim-idle", "3"])
    assert not hasattr(args, "renew_s") and not hasattr(args, "autoclaim_s")
    s = WorkerSettings(model_dir="m", claim_idle_s=args.claim_idle_s)
    assert (s.renew_s, s.autoclaim_s) == (1.0, 0.5)


def test_a_claim_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        WorkerSettings(model_dir="m", claim_idle_s=0)


def test_a_copy_with_another_claim_idle_derives_the_timing_again() -> None:
    s = WorkerSettings(model_dir="m").model_copy(update={"claim_idle_s": 3.0})
    assert (s.renew_s, s.autoclaim_s) == claim_timing(3.0)
    pinned = WorkerSettings(model_dir="m", renew_s=1.0).model_copy(update={"claim_idle_s": 6.0})
    assert (pinned.renew_s, pinned.autoclaim_s) == (1.0, claim_timing(6.0)[1])  # a pinned one stays
    again = pinned.model_copy(update={"model_dir": "n"})  # other fields: the timing as it was
    assert (again.renew_s, again.autoclaim_s) == (1.0, 1.0)
    with pytest.raises(ValueError, match="renew_s"):
        pinned.model_copy(update={"claim_idle_s": 0.5})
