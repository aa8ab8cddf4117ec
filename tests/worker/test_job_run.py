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


def test_resumed_run_emits_only_what_the_client_has_not_seen() -> None:
    first, _ = _play(_run(), [[t] for t in IDS])
    seen = first[:7]  # a client saw these before the first worker died
    resume = Resume.from_events(seen)
    # The re-run steps differently (chunks of 5), yet nothing is repeated or lost.
    rest, final = _play(_run(resume=resume), [IDS[i : i + 5] for i in range(0, len(IDS), 5)])
    all_events = seen + rest
    assert [t for e in all_events for t in e.token_ids] == IDS
    assert "".join(e.text for e in all_events) == TEXT == final.text  # type: ignore[attr-defined]
    assert rest[0].index == resume.tokens
