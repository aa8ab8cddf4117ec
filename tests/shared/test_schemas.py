from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.control import Decision, WorkerInfo
from shared.schemas import ChatMessage, JobRequest, SamplingParams


def test_job_request_needs_exactly_one_input() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        JobRequest(job_id="j")
    with pytest.raises(ValidationError, match="exactly one"):
        JobRequest(job_id="j", prompt="a", prompt_token_ids=[1])
    with pytest.raises(ValidationError, match="must not be empty"):
        JobRequest(job_id="j", prompt_token_ids=[])
    with pytest.raises(ValidationError, match="must not be empty"):
        JobRequest(job_id="j", messages=[])
    with pytest.raises(ValidationError):
        JobRequest(job_id="", prompt="a")
    assert JobRequest(job_id="j", messages=[ChatMessage(role="user", content="x")]).messages


def test_sampling_params_bounds() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.5).greedy
    for bad in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"stop": [""]}):
        with pytest.raises(ValidationError):
            SamplingParams(**bad)
    with pytest.raises(ValidationError):
        SamplingParams(stop=["x"] * 17)
    with pytest.raises(ValidationError):
        SamplingParams(unknown=1)  # type: ignore[call-arg]


def test_decision_gamma_buckets_and_staleness() -> None:
    d = Decision(
        version=1, policy="p", gamma_table=[(1, 4), (8, 2), (32, 1)], created_at=100.0, valid_for_s=10
    )
    assert [d.gamma_for(b) for b in (1, 2, 8, 9, 32, 33)] == [4, 2, 2, 1, 1, 1]
    assert Decision(version=1, policy="p", gamma_table=[]).gamma_for(3) == 0
    assert not d.is_stale(110.0)
    assert d.is_stale(110.5)


def test_worker_info_liveness() -> None:
    w = WorkerInfo(worker_id="w", model="m", ts=50.0)
    assert w.is_alive(60.0, timeout_s=15)
    assert not w.is_alive(70.0, timeout_s=15)
