from __future__ import annotations

from shared.schemas import JobRequest, SamplingParams, TokenEvent
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
