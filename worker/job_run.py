"""One job on one worker: its output so far and the events a client has yet to see."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from shared.schemas import FinishEvent, FinishReason, JobRequest, Message, TokenEvent
from worker.detokenizer import Decoder, IncrementalDetokenizer, StopText


@dataclass(frozen=True)
class Resume:
    """How much of the output a client may already have seen from earlier attempts.

    A re-run of a greedy or seeded job reproduces the same tokens, so the worker regenerates
    them and emits only what lies past these counts: no token or character is sent twice.
    """

    tokens: int = 0
    chars: int = 0

    @classmethod
    def from_events(cls, events: Iterable[Message]) -> Resume:
        tokens = chars = 0
        for ev in events:
            if isinstance(ev, TokenEvent):
                tokens = max(tokens, ev.index + len(ev.token_ids))
                chars += len(ev.text)
        return cls(tokens, chars)


class JobRun:
    """Feeds generated tokens through detokenization and stop strings into TokenEvents."""

    def __init__(
        self,
        job: JobRequest,
        entry_id: bytes,
        prompt_ids: list[int],
        tokenizer: Decoder,
        worker_id: str,
        resume: Resume = Resume(),
    ) -> None:
        self.job = job
        self.entry_id = entry_id
        self.prompt_ids = prompt_ids
        self.worker_id = worker_id
        self.resume = resume
        self.output: list[int] = []
        self.first_token_at: float | None = None
        self._detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._text = StopText(job.params.stop)

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def stopped(self) -> bool:
        """A stop string appeared: the job is done, the engine should abort it."""
        return self._text.stopped

    def feed(self, token_ids: list[int]) -> list[TokenEvent]:
        """Take the engine's new tokens (tokens after a stop string are dropped)."""
        if token_ids and self.first_token_at is None:
            self.first_token_at = time.time()
        n0, r0 = len(self.output), self._text.released
        for token in token_ids:
            if self._text.stopped:
                break
            self.output.append(token)
            self._text.push(self._detok.add(token))
        return self._events(n0, r0)

    def finish(self, reason: FinishReason) -> tuple[list[TokenEvent], FinishEvent]:
        """The last text events (what was held back) and the final result."""
        n0, r0 = len(self.output), self._text.released
        if not self._text.stopped:
            self._text.push(self._detok.flush())
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
        )
        return self._events(n0, r0), final

    def _events(self, n0: int, r0: int) -> list[TokenEvent]:
        n1, r1 = len(self.output), self._text.released
        t_from, c_from = max(n0, self.resume.tokens), max(r0, self.resume.chars)
        ids = self.output[t_from:n1] if n1 > t_from else []
        text = self._text.text[c_from:r1] if r1 > c_from else ""
        if not ids and not text:
            return []
        return [TokenEvent(job_id=self.job_id, index=t_from if ids else n1, token_ids=ids, text=text)]
