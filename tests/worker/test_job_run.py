from __future__ import annotations

from shared.errors import ErrorCode
from shared.schemas import FinishReason, JobRequest, Logprobs, SamplingParams, TokenEvent
from tests.tiny_models import build_tokenizer
from worker.job_run import JobRun, Resume

TOK = build_tokenizer()
TEXT = "The quick brown fox jumps over the lazy dog. Héllo 東京"
IDS = TOK(TEXT, add_special_tokens=False)["input_ids"]
PROMPT = TOK("Once")["input_ids"]


def _run(stop: list[str] | None = None, resume: Resume | None = None) -> JobRun:
    job = JobRequest(job_id="j", prompt="Once", params=SamplingParams(max_tokens=100, stop=stop or []))
    return JobRun(job, b"1-0", PROMPT, TOK, "w", resume or Resume())


def _play(run: JobRun, chunks: list[list[int]]) -> tuple[list[TokenEvent], object]:
    events: list[TokenEvent] = []
    for chunk in chunks:
        events += run.feed(chunk)
        if run.stopped:
            break
    tail, final = run.finish("stop" if run.stopped else "length")
    return events + tail, final


def test_events_carry_every_token_once_with_its_output_index() -> None:
    events, final = _play(_run(), [IDS[i : i + 3] for i in range(0, len(IDS), 3)])
    assert [t for e in events for t in e.token_ids] == IDS == final.token_ids  # type: ignore[attr-defined]
    assert "".join(e.text for e in events) == TEXT == final.text  # type: ignore[attr-defined]
    index = 0
    for e in events:
        if e.token_ids:
            assert e.index == index
            index += len(e.token_ids)


def test_stop_string_ends_the_run_and_cuts_the_text() -> None:
    events, final = _play(_run(stop=["fox"]), [[t] for t in IDS])
    assert final.text == "The quick brown "  # type: ignore[attr-defined]
    assert "".join(e.text for e in events) == final.text  # type: ignore[attr-defined]
    assert len(final.token_ids) < len(IDS)  # type: ignore[attr-defined]


def test_resumed_run_continues_after_what_the_client_has_seen() -> None:
    first, _ = _play(_run(), [[t] for t in IDS])
    seen = first[:7]  # a client saw these before the first worker died
    resume = Resume.from_events(seen)
    assert list(resume.token_ids) == [t for e in seen for t in e.token_ids]
    run = _run(resume=resume)
    # The engine continues from prompt + the output sent, for the tokens left.
    request = run.engine_request()
    assert request.prompt_token_ids == PROMPT + list(resume.token_ids)
    assert request.params.max_tokens == 100 - resume.tokens
    rest_ids = IDS[resume.tokens :]
    rest, final = _play(run, [rest_ids[i : i + 5] for i in range(0, len(rest_ids), 5)])
    all_events = seen + rest
    assert [t for e in all_events for t in e.token_ids] == IDS == final.token_ids  # type: ignore[attr-defined]
    assert "".join(e.text for e in all_events) == TEXT == final.text  # type: ignore[attr-defined]
    assert rest[0].index == resume.tokens


def test_a_resumed_run_whose_sent_output_reached_max_tokens_is_over() -> None:
    resume = Resume(token_ids=tuple(IDS[:100]))
    run = _run(resume=resume)
    assert run.resumed_final_reason(frozenset()) == ("length" if len(IDS) >= 100 else None)
    eos = Resume(token_ids=(IDS[0], 2))
    assert _run(resume=eos).resumed_final_reason(frozenset({2})) == "stop"
    assert _run().resumed_final_reason(frozenset({2})) is None


def test_a_stop_token_ends_the_run_before_it() -> None:
    stop_at = IDS.index(IDS[5])  # the first occurrence of that token
    params = SamplingParams(max_tokens=100, stop_token_ids=[IDS[5]])
    run = JobRun(JobRequest(job_id="j", prompt="Once", params=params), b"1-0", PROMPT, TOK, "w")
    events, final = _play(run, [IDS[i : i + 4] for i in range(0, len(IDS), 4)])
    assert run.stopped and final.finish_reason == "stop"  # type: ignore[attr-defined]
    assert final.token_ids == IDS[:stop_at]  # type: ignore[attr-defined]
    assert "".join(e.text for e in events) == final.text == TOK.decode(IDS[:stop_at])  # type: ignore[attr-defined]


def _lp(ids: list[int], first: float = -1.0) -> Logprobs:
    """Engine-style logprobs (ids and values, no text) of ``ids``: token i gets first - i."""
    return Logprobs(
        token_ids=list(ids),
        logprobs=[first - i for i in range(len(ids))],
        top_ids=[[t, 0] for t in ids],
        top_logprobs=[[first - i, -50.0] for i in range(len(ids))],
    )


def _lp_run(resume: Resume | None = None, stop_token_ids: list[int] | None = None) -> JobRun:
    params = SamplingParams(
        max_tokens=100, logprobs=2, prompt_logprobs=1, stop_token_ids=stop_token_ids or []
    )
    job = JobRequest(job_id="j", prompt="Once", params=params)
    return JobRun(job, b"1-0", PROMPT, TOK, "w", resume or Resume())


def test_logprobs_follow_their_tokens_rendered_and_prompt_logprobs_come_once() -> None:
    run = _lp_run()
    events: list[TokenEvent] = []
    prompt_lp = Logprobs(token_ids=PROMPT, logprobs=[None] + [-2.0] * (len(PROMPT) - 1))
    prompt_lp.top_ids = [[]] + [[t] for t in PROMPT[1:]]
    prompt_lp.top_logprobs = [[]] + [[-2.0] for _ in PROMPT[1:]]
    for k, i in enumerate(range(0, len(IDS), 3)):
        chunk = IDS[i : i + 3]
        events += run.feed(chunk, _lp(chunk, -1.0 - i), prompt_lp if k == 0 else None)
    tail, final = run.finish("length")
    events += tail
    with_ids = [e for e in events if e.token_ids]
    assert all(e.logprobs is not None and e.logprobs.token_ids == e.token_ids for e in with_ids)
    assert [e.prompt_logprobs is not None for e in events].count(True) == 1
    assert events[0].prompt_logprobs is not None and events[0].prompt_logprobs.token_ids == PROMPT
    assert final.logprobs is not None and final.logprobs.token_ids == IDS
    assert final.logprobs.logprobs == [-1.0 - i for i in range(len(IDS))]
    assert final.logprobs.tokens == [TOK.decode([t]) for t in IDS]
    assert final.logprobs.top_tokens[0] == [TOK.decode([IDS[0]]), TOK.decode([0])]
    assert final.prompt_logprobs is not None and final.prompt_logprobs.tokens[0] == TOK.decode(PROMPT[:1])


def test_a_stop_token_has_no_logprobs_and_a_resumed_run_keeps_those_sent() -> None:
    run = _lp_run(stop_token_ids=[IDS[5]])
    sent = run.feed(IDS[:4], _lp(IDS[:4]), Logprobs(token_ids=PROMPT, logprobs=[None] * len(PROMPT)))
    resume = Resume.from_events(sent)
    assert len(resume.logprobs) == resume.tokens == 4 and resume.prompt_logprobs is not None
    again = _lp_run(resume=resume, stop_token_ids=[IDS[5]])
    request = again.engine_request()
    assert request.params.prompt_logprobs is None, "prompt logprobs were sent already"
    rest = again.feed(IDS[4:8], _lp(IDS[4:8], -9.0))
    _, final = again.finish("stop")
    assert final.token_ids == IDS[:5]  # cut before the stop token
    assert final.logprobs is not None and final.logprobs.token_ids == IDS[:5]
    assert final.logprobs.logprobs == [-1.0, -2.0, -3.0, -4.0, -9.0]
    assert all(e.prompt_logprobs is None for e in rest)


def _kind_run(kind: str, progress_s: float) -> JobRun:
    job = JobRequest(job_id="j", prompt="Once", params=SamplingParams(max_tokens=100), output_kind=kind)  # type: ignore[arg-type]
    return JobRun(job, b"1-0", PROMPT, TOK, "w", progress_s=progress_s)


def _released(run: JobRun, chunks: list[list[int]]) -> list[list[TokenEvent]]:
    """The events of each step: the chunks fed one a step, then the tail with the result."""
    writes = [run.feed(chunk) for chunk in chunks]
    tail, _ = run.finish("length")
    writes.append(tail)
    return writes


def test_a_final_only_job_writes_its_tokens_joined_with_the_result() -> None:
    chunks = [IDS[i : i + 2] for i in range(0, len(IDS), 2)]
    delta = _released(_kind_run("delta", 60), chunks)
    held = _released(_kind_run("final_only", 60), chunks)
    assert sum(bool(w) for w in delta) > len(chunks) // 2  # every step that released text
    assert not any(held[:-1]) and len(held[-1]) == 1  # nothing until the end, then one event
    (joined,) = held[-1]
    assert joined.index == 0 and joined.token_ids == IDS and joined.text == TEXT
    assert [t for w in delta for e in w for t in e.token_ids] == IDS


def test_a_final_only_job_writes_progress_every_interval() -> None:
    chunks = [IDS[i : i + 2] for i in range(0, len(IDS), 2)]
    writes = _released(_kind_run("final_only", 0.0), chunks)  # the interval always passed
    events = [e for w in writes for e in w]
    assert len(events) > 1 and [t for e in events for t in e.token_ids] == IDS
    index = 0
    for e in events:  # every position once, in order: what a re-run's Resume reads
        if e.token_ids:
            assert e.index == index
            index += len(e.token_ids)
    assert Resume.from_events(events).token_ids == tuple(IDS)
    assert "".join(e.text for e in events) == TEXT


def test_a_rerun_of_a_final_only_job_continues_after_what_was_written() -> None:
    run = _kind_run("final_only", 0.0)
    first = [e for chunk in (IDS[:3], IDS[3:6]) for e in run.feed(chunk)]
    resume = Resume.from_events(first)
    again = JobRun(run.job, b"1-0", PROMPT, TOK, "w", resume, progress_s=60)
    tail = [e for chunk in (IDS[6:8], IDS[8:]) for e in again.feed(chunk)] + again.finish("length")[0]
    assert len(tail) == 1 and tail[0].index == len(resume.token_ids)
    assert [t for e in first + tail for t in e.token_ids] == IDS
    assert "".join(e.text for e in first + tail) == TEXT


def test_done_once_the_job_ended_here_or_was_let_go() -> None:
    """``done`` is derived: set by the final event (finish, fail) or by letting the job go."""
    finished, failed, lost = _run(), _run(), _run()
    assert not (finished.done or failed.done or lost.done)
    finished.feed(IDS[:3])
    assert not finished.done
    finished.finish(FinishReason.LENGTH)
    err = failed.fail(ErrorCode.ENGINE_ERROR, "boom")
    assert err.code is ErrorCode.ENGINE_ERROR and err.job_id == "j"
    lost.let_go()
    assert finished.done and failed.done and lost.done
