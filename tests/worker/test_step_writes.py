"""A step's outputs become each job's writes; a job whose output fails to become events fails
alone (worker/step_writes.py), and an engine that gives no draft outcomes still gets
valid speculation facts (worker/job_run.py ``_take_steps``)."""

from __future__ import annotations

from shared.schemas import ErrorEvent, JobRequest, SamplingParams, TokenEvent
from tests.tiny_models import build_tokenizer
from worker.engine.api import DraftOutcome, RequestOutput
from worker.job_run import JobRun
from worker.running import RunningJobs
from worker.step_writes import step_writes

TOK = build_tokenizer()
IDS = TOK("The quick brown fox", add_special_tokens=False)["input_ids"]
PROMPT = TOK("Once")["input_ids"]


def _run(job_id: str, spec: bool = True) -> JobRun:
    job = JobRequest(job_id=job_id, prompt="Once", params=SamplingParams(max_tokens=100), include_spec=spec)
    return JobRun(job, b"1-0", PROMPT, TOK, "w", lease=1)


def test_tokens_without_outcomes_get_one_plain_step_each() -> None:
    assert len(IDS) >= 3
    run = _run("j")
    (ev,) = run.feed(IDS[:3])  # no outcomes at all
    assert ev.spec is not None and [s.tokens for s in ev.spec.steps] == [1, 1, 1]
    (ev,) = run.feed(IDS[3:5], outcomes=[DraftOutcome(tokens=7)])  # ones that do not add up
    assert ev.spec is not None and sum(s.tokens for s in ev.spec.steps) == len(IDS[3:5])
    assert all(s.accepted == 0 for s in ev.spec.steps)


class _Engine:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, request_id: str) -> None:
        self.aborted.append(request_id)


def test_a_job_whose_output_fails_fails_alone() -> None:
    running = RunningJobs(4)
    engine = _Engine()
    bad, good = _run("bad"), _run("good")
    running.admit(bad)
    running.admit(good)

    def broken(*args: object, **kwargs: object) -> list[TokenEvent]:
        raise ValueError("a bug")

    bad.feed = broken  # type: ignore[method-assign]
    outputs = [RequestOutput("bad", IDS[:2]), RequestOutput("good", IDS[:2])]
    writes = step_writes(running, engine, outputs)  # type: ignore[arg-type]
    by_job = {w.job_id: w for w in writes}
    assert isinstance(by_job["bad"].final, ErrorEvent) and by_job["bad"].events == []
    assert by_job["bad"].final.code == "engine_error" and bad.done
    assert engine.aborted == ["bad"]
    assert by_job["good"].final is None
    assert [e.token_ids for e in by_job["good"].events if isinstance(e, TokenEvent)] == [IDS[:2]]
