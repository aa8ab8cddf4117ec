"""A job that asks for its speculation facts (``include_spec``) gets, in every token event,
the engine steps of its tokens and its text token by token, marked drafted or not — across
multi-byte characters, stop strings, stop tokens, joined events and a failover."""

from __future__ import annotations

from shared.schemas import JobRequest, SamplingParams, SpecSpan, TokenEvent
from tests.tiny_models import build_tokenizer
from worker.engine.api import DraftOutcome
from worker.job_run import JobRun, Resume
from worker.outbox import coalesce

TOK = build_tokenizer()
TEXT = "The quick brown fox jumps over the lazy dog. Héllo 東京"
IDS = TOK(TEXT, add_special_tokens=False)["input_ids"]
PROMPT = TOK("Once")["input_ids"]


def _run(
    stop: list[str] | None = None, resume: Resume | None = None, spec: bool = True, **params: object
) -> JobRun:
    job = JobRequest(
        job_id="j",
        prompt="Once",
        params=SamplingParams(max_tokens=100, stop=stop or [], **params),  # type: ignore[arg-type]
        include_spec=spec,
    )
    return JobRun(job, b"1-0", PROMPT, TOK, "w", resume or Resume())


def _steps(ids: list[int], pattern: list[int]) -> list[tuple[list[int], list[DraftOutcome]]]:
    """Feed ``ids`` in steps whose accepted drafts cycle through ``pattern`` (a step of k
    accepted drafts emits k + 1 tokens: the drafts, then the target's own)."""
    out, i, k = [], 0, 0
    while i < len(ids):
        acc = pattern[k % len(pattern)]
        k += 1
        chunk = ids[i : i + acc + 1]
        outcome = DraftOutcome(len(chunk), min(acc, len(chunk)), acc, max(acc, 2), "ngram" if acc else None)
        out.append((chunk, [outcome]))
        i += len(chunk)
    return out


def _play(run: JobRun, steps: list[tuple[list[int], list[DraftOutcome]]]) -> tuple[list[TokenEvent], object]:
    events: list[TokenEvent] = []
    for ids, outcomes in steps:
        events += run.feed(ids, outcomes=outcomes)
        if run.stopped:
            break
    tail, final = run.finish("stop" if run.stopped else "length")
    return events + tail, final


def _flags(steps: list[tuple[list[int], list[DraftOutcome]]]) -> list[bool]:
    return [j < o.accepted for _, os in steps for o in os for j in range(o.tokens)]


def test_every_token_is_marked_as_its_step_made_it() -> None:
    steps = _steps(IDS, [0, 2, 1, 3])
    events, final = _play(_run(), steps)
    assert all(e.spec is not None for e in events)
    drafted = [f for e in events for f in e.spec.drafted]  # type: ignore[union-attr]
    assert drafted == _flags(steps) and any(drafted) and not all(drafted)
    spans = [s for e in events for s in e.spec.spans]  # type: ignore[union-attr]
    assert "".join(s.text for s in spans) == TEXT == final.text  # type: ignore[attr-defined]
    # each span's mark is its token's; the tokens' texts come in output order
    flags = _flags(steps)
    assert all(s.drafted == flags[s.token] for s in spans)
    assert [s.token for s in spans] == sorted(s.token for s in spans)
    # a multi-byte character split over byte tokens belongs to the token that completed it
    assert "東" in "".join(s.text for s in spans if s.token >= len(IDS) - 4)
    gammas = {st.gamma for e in events for st in e.spec.steps}  # type: ignore[union-attr]
    assert gammas >= {2, 3}


def test_a_stop_string_cuts_the_spans_and_the_held_text_is_its_tokens() -> None:
    events, final = _play(_run(stop=["fox"]), _steps(IDS, [2]))
    assert final.text == "The quick brown "  # type: ignore[attr-defined]
    spans = [s for e in events for s in e.spec.spans]  # type: ignore[union-attr]
    assert "".join(s.text for s in spans) == final.text  # type: ignore[attr-defined]
    steps = [st for e in events for st in e.spec.steps]  # type: ignore[union-attr]
    assert sum(st.tokens for st in steps) == len(final.token_ids)  # type: ignore[attr-defined]


def test_a_stop_token_inside_a_step_keeps_the_step_up_to_it() -> None:
    stop = IDS[5]
    events, final = _play(
        _run(stop_token_ids=[stop]),
        [(IDS[:4], [DraftOutcome(4, 3, 3, 3, "copy")]), (IDS[4:8], [DraftOutcome(4, 3, 3, 3, "copy")])],
    )
    assert final.token_ids == IDS[:5]  # type: ignore[attr-defined]
    steps = [st for e in events for st in e.spec.steps]  # type: ignore[union-attr]
    assert [(st.tokens, st.accepted) for st in steps] == [(4, 3), (1, 1)]


def test_joined_events_keep_their_steps_and_spans_in_order() -> None:
    run = _run()
    events: list[TokenEvent] = []
    for ids, outcomes in _steps(IDS[:12], [1]):
        events += run.feed(ids, outcomes=outcomes)
    (joined,) = coalesce(list(events))
    assert isinstance(joined, TokenEvent) and joined.spec is not None
    assert joined.token_ids == IDS[:12] and joined.spec.drafted == _flags(_steps(IDS[:12], [1]))
    assert "".join(s.text for s in joined.spec.spans) == joined.text


def test_without_asking_no_event_carries_spec() -> None:
    events, _ = _play(_run(spec=False), _steps(IDS, [2]))
    assert events and all(e.spec is None for e in events)


def test_after_a_failover_text_of_an_earlier_attempt_is_unmarked() -> None:
    first, _ = _play(_run(stop=["lazy dog!"]), _steps(IDS, [1]))
    seen = first[:3]
    run = _run(stop=["lazy dog!"], resume=Resume.from_events(seen))
    rest_ids = IDS[Resume.from_events(seen).tokens :]
    rest, final = _play(run, _steps(rest_ids, [2]))
    spans: list[SpecSpan] = [s for e in rest for s in e.spec.spans]  # type: ignore[union-attr]
    assert "".join(e.text for e in seen + rest) == TEXT == final.text  # type: ignore[attr-defined]
    assert "".join(s.text for s in spans) == "".join(e.text for e in rest)
    resumed = Resume.from_events(seen).tokens
    assert all(s.drafted is None for s in spans if s.token < resumed)
    assert all(s.drafted is not None for s in spans if s.token >= resumed)
