"""One job on one worker: its output so far and the events a client has yet to see."""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.errors import ErrorCode
from shared.schemas import (
    ErrorEvent,
    FinishEvent,
    FinishReason,
    JobRequest,
    Logprobs,
    Message,
    SpecSpan,
    SpecStep,
    Speculation,
    TokenEvent,
)
from worker.detokenizer import Decoder, IncrementalDetokenizer, StopText
from worker.engine.api import DraftOutcome, EngineRequest


@dataclass(frozen=True)
class Resume:
    """The output that earlier attempts of the job already sent to its client.

    A re-run continues from it: the engine gets prompt + these tokens as its prompt and
    generates only the rest, so a client sees one output — for a sampled job one sample,
    not the splice of two draws; for a greedy one the target's own continuation — and no
    token or character twice.
    """

    token_ids: tuple[int, ...] = ()
    chars: int = 0
    logprobs: tuple[Logprobs, ...] = ()  # one per token sent, when the job asks for logprobs
    prompt_logprobs: Logprobs | None = None  # sent already (on the first token event)

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @classmethod
    def from_events(cls, events: Iterable[Message]) -> Resume:
        ids: list[int] = []
        lps: list[Logprobs] = []
        prompt: Logprobs | None = None
        chars = 0
        for ev in events:
            if isinstance(ev, TokenEvent):
                if ev.token_ids and ev.index <= len(ids):
                    ids[ev.index :] = ev.token_ids  # an event overlapping the last is a re-send
                    if ev.logprobs is not None and ev.index <= len(lps):
                        lps[ev.index :] = [ev.logprobs.slice(i, i + 1) for i in range(len(ev.logprobs))]
                chars += len(ev.text)
                prompt = ev.prompt_logprobs or prompt
        return cls(tuple(ids), chars, tuple(lps) if len(lps) == len(ids) else (), prompt)


class JobRun:
    """Feeds generated tokens through detokenization and stop strings into TokenEvents.

    ``lease`` is the fence this worker holds on the job (worker/leases.py); ``done`` turns
    true once this run made the job's final event (``finish``, ``fail``) or let the job go
    (``let_go``: lost to another worker, handed back), after which outputs are ignored.
    ``progress_s``: how often a ``final_only`` job's tokens become events (``feed``).

    A job that asks for its speculation facts (``include_spec``) also keeps, per output
    token, whether it was an accepted draft and where its text ends in the (uncut) text, so
    each event's ``spec`` gives its steps and its text token by token.
    """

    def __init__(
        self,
        job: JobRequest,
        entry_id: bytes,
        prompt_ids: list[int],
        tokenizer: Decoder,
        worker_id: str,
        resume: Resume = Resume(),
        lease: int = 0,
        alone: bool = False,
        progress_s: float = 0.5,
    ) -> None:
        self.job = job
        self.entry_id = entry_id
        self.prompt_ids = prompt_ids
        self.worker_id = worker_id
        self.resume = resume
        self.lease = lease
        self.alone = alone  # on its last delivery: runs with no batch mates (see worker/service.py)
        self._ended = False  # ``done``: set by finish, fail and let_go only
        self.cancelled = False  # a cancel for it came (worker/running.py ``cancel``)
        self.attempt = 1  # this delivery's number (worker/admission.py sets it)
        self.output: list[int] = []
        # Times (wall clock, like the job's created_at) for the request metrics: handed to the
        # engine, first and last output; the gaps between consecutive outputs (one a step).
        self.started_at = time.time()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.gaps: list[float] = []
        self.cached_prompt_tokens = 0  # prompt tokens the engine's prefix cache served
        self._progress_s = progress_s if job.output_kind == "final_only" else None
        self._released_at = time.monotonic()
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._text = StopText(job.params.stop)
        self._stop_ids = frozenset(job.params.stop_token_ids)
        self._stopped_by_id = False
        self._tokens = tokenizer  # renders logprob tokens
        self._pieces: dict[int, str] = {}
        asked = job.params.logprobs is not None
        self._logprobs: list[Logprobs] | None = list(resume.logprobs) if asked else None
        if self._logprobs is not None and len(self._logprobs) != resume.tokens:  # sent without them
            unknown = [
                Logprobs(
                    token_ids=[t],
                    tokens=[""],
                    logprobs=[None],
                    top_ids=[[]],
                    top_tokens=[[]],
                    top_logprobs=[[]],
                )
                for t in resume.token_ids
            ]
            self._logprobs = unknown
        self._prompt_logprobs = resume.prompt_logprobs
        self._prompt_sent = resume.prompt_logprobs is not None
        self._spec = job.include_spec
        self._drafted: list[bool | None] = []  # per output token (None: an earlier attempt's)
        self._ends: list[int] = []  # per output token: the uncut text's length once it was decoded
        self._chars = 0  # characters decoded so far, before any stop-string cut
        self._steps: list[SpecStep] = []  # steps whose tokens no event carried yet
        for token in resume.token_ids:  # what was sent already: replayed, not re-emitted
            self._push(token, None)
        self._sent = (len(self.output), max(self._text.released, resume.chars))  # in events so far

    def engine_request(self) -> EngineRequest:
        """What the engine runs: the prompt plus the output sent already, for the rest."""
        params = self.job.params
        if self.resume.token_ids:
            left = max(1, params.max_tokens - self.resume.tokens)
            params = params.model_copy(update={"max_tokens": left})
        if self._prompt_sent:
            params = params.model_copy(update={"prompt_logprobs": None})
        return EngineRequest(
            self.job_id,
            self.prompt_ids + list(self.resume.token_ids),
            params,
            self.job.priority,
            resumed=self.resume.tokens,
        )

    def resumed_final_reason(self, eos_token_ids: frozenset[int]) -> FinishReason | None:
        """Whether the output sent already ends the job (its length, or an EOS token)."""
        if not self.resume.token_ids:
            return None
        if self.resume.tokens >= self.job.params.max_tokens:
            return FinishReason.LENGTH
        if not self.job.params.ignore_eos and self.resume.token_ids[-1] in eos_token_ids:
            return FinishReason.STOP
        return FinishReason.STOP if self.stopped else None

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def stopped(self) -> bool:
        """A stop string or stop token appeared: the job is done, the engine should abort it."""
        return self._text.stopped or self._stopped_by_id

    def _push(self, token: int, drafted: bool | None) -> None:
        """One more output token through detokenization and stop strings."""
        self.output.append(token)
        delta = self._detok.add(token)
        if self._spec:
            if not self._text.stopped:
                self._chars += len(delta)
            self._ends.append(self._chars)
            self._drafted.append(drafted)
        self._text.push(delta)

    def feed(
        self,
        token_ids: list[int],
        logprobs: Logprobs | None = None,
        prompt_logprobs: Logprobs | None = None,
        outcomes: Sequence[DraftOutcome] = (),
    ) -> list[TokenEvent]:
        """Take the engine's new tokens (tokens after a stop string are dropped), their
        logprobs (one entry per token) when the job asks for them and the steps' draft
        outcomes (``RequestOutput.outcomes``); the events to write.

        A job whose client may follow its tokens (``delta``) gets an event for each step's
        new text. A ``final_only`` one (its client waits for the result alone) gets one for
        everything since the last only every ``progress_s``, and the rest with ``finish``:
        writing every step's tokens cost the worker and Redis more than anyone reads."""
        if token_ids:
            now = time.time()
            if self.last_token_at is not None:
                self.gaps.append(now - self.last_token_at)
            self.first_token_at = now if self.first_token_at is None else self.first_token_at
            self.last_token_at = now
        if prompt_logprobs is not None and self._prompt_logprobs is None:
            self._prompt_logprobs = self._render(prompt_logprobs.slice(0, len(self.prompt_ids)))
        rendered = self._render(logprobs) if self._logprobs is not None and logprobs is not None else None
        flags = [j < o.accepted for o in outcomes for j in range(o.tokens)] if self._spec else []
        taken = 0
        for i, token in enumerate(token_ids):
            if self.stopped:
                break
            if token in self._stop_ids:  # a stop token ends the output; it is not part of it
                self._stopped_by_id = True
                break
            self._push(token, flags[i] if i < len(flags) else None)
            taken += 1
            if self._logprobs is not None and rendered is not None:
                self._logprobs.append(rendered.slice(i, i + 1))
        if self._spec:
            self._take_steps(outcomes, taken, len(token_ids))
        if self._progress_s is not None:
            now = time.monotonic()
            if now - self._released_at < self._progress_s:
                return []
            self._released_at = now
        return self._events()

    def _take_steps(self, outcomes: Sequence[DraftOutcome], taken: int, given: int) -> None:
        """Keep the steps of the ``taken`` tokens that joined the output (a stop drops the
        rest); an engine that gave no outcomes for them (or ones that do not add up) gets one
        plain step per token: a step emits at most one token that is not an accepted draft."""
        if sum(o.tokens for o in outcomes) != given:
            outcomes = [DraftOutcome(tokens=1)] * given
        left = taken
        for o in outcomes:
            if left <= 0:
                break
            n = min(o.tokens, left)
            # without outcomes the tokens' flags are unknown: counted as none drafted
            accepted = min(o.accepted, n)
            self._steps.append(
                SpecStep(tokens=n, accepted=accepted, drafted=o.drafted, gamma=o.gamma, drafter=o.drafter)
            )
            left -= n

    def _spans(self, start: int, stop: int) -> list[SpecSpan]:
        """Text ``start .. stop`` cut where the output token that produced it changes."""
        out: list[SpecSpan] = []
        text, pos = self._text.text, start
        if not self._ends:
            return [SpecSpan(text=text[start:stop], token=0)] if stop > start else []
        while pos < stop:
            i = min(bisect_right(self._ends, pos), len(self._ends) - 1)
            end = stop if i == len(self._ends) - 1 else min(stop, self._ends[i])
            out.append(SpecSpan(text=text[pos:end], token=i, drafted=self._drafted[i]))
            pos = end
        return out

    def _render(self, lp: Logprobs) -> Logprobs:
        """``lp`` with each token's text (the tokenizer's rendering of that token alone)."""

        def piece(t: int) -> str:
            if t not in self._pieces:
                self._pieces[t] = str(self._tokens.decode([t], skip_special_tokens=False))
            return self._pieces[t]

        tokens = [piece(t) for t in lp.token_ids]
        top = [[piece(t) for t in row] for row in lp.top_ids]
        return lp.model_copy(update={"tokens": tokens, "top_tokens": top})

    def _logprobs_of(self, start: int, stop: int) -> Logprobs | None:
        return None if self._logprobs is None else Logprobs.join(self._logprobs[start:stop])

    @property
    def done(self) -> bool:
        """Whether the job ended here: its final event made (``finish``, ``fail``) or the job
        let go (``let_go``); its outputs are ignored from then on."""
        return self._ended

    def let_go(self) -> None:
        """The job is no longer this run's (lost to another worker, or handed back): done,
        with no final event from here."""
        self._ended = True

    def fail(self, code: ErrorCode, message: str) -> ErrorEvent:
        """The job's final event when it fails here (done from now on)."""
        self._ended = True
        return ErrorEvent(job_id=self.job_id, code=code, message=message)

    def finish(self, reason: FinishReason) -> tuple[list[TokenEvent], FinishEvent]:
        """The last text events (what was held back) and the final result (done from now
        on)."""
        if not self._text.stopped:  # a stop token: the text so far stands, flushed
            tail = self._detok.flush()
            if self._spec and self._ends:
                self._chars += len(tail)
                self._ends[-1] = self._chars  # held for an unfinished character: the last token's
            self._text.push(tail)
            self._text.flush()
        now = time.time()
        final = FinishEvent(
            job_id=self.job_id,
            finish_reason=reason,
            text=self._text.text,
            token_ids=list(self.output),
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output),
            worker_id=self.worker_id,
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.job.created_at,
            latency_s=now - self.job.created_at,
            logprobs=self._logprobs_of(0, len(self.output)),
            prompt_logprobs=self._prompt_logprobs,
        )
        self._ended = True
        return self._events(), final

    def _events(self) -> list[TokenEvent]:
        """What came since the last event, as one (none if nothing did)."""
        n1, r1 = len(self.output), self._text.released
        t_from, c_from = self._sent
        ids = self.output[t_from:n1] if n1 > t_from else []
        text = self._text.text[c_from:r1] if r1 > c_from else ""
        if not ids and not text:
            return []
        self._sent = (n1, max(r1, c_from))
        prompt = None
        if ids and not self._prompt_sent and self._prompt_logprobs is not None:
            prompt, self._prompt_sent = self._prompt_logprobs, True
        spec = None
        if self._spec:
            spec = Speculation(steps=self._steps if ids else [], spans=self._spans(c_from, max(r1, c_from)))
            if ids:
                self._steps = []
        return [
            TokenEvent(
                job_id=self.job_id,
                index=t_from if ids else n1,
                token_ids=ids,
                text=text,
                logprobs=self._logprobs_of(t_from, n1) if ids else None,
                prompt_logprobs=prompt,
                spec=spec,
            )
        ]
