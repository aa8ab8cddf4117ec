"""What one reader of a job's events already sent its client: output positions are sent once.

A Redis failover can lose writes a reader was already sent; the job's re-run then writes
those output positions again after them (worker/leases.py, worker/job_run.py ``Resume``).
A reader keeps its mark (``SentMark``) for its whole life — across the reads it resumes
after a Redis outage (gateway/outage.py) — and a reader that starts after a Last-Event-ID
primes it from the stream up to that entry. An event wholly sent already is dropped; one
that overlaps the mark is trimmed to its unseen tokens (their logprobs, speculation facts
and, where the event's start is known, text).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.schemas import Message, SpecStep, Speculation, TokenEvent


@dataclass
class SentMark:
    """Output positions (``tokens``) and characters (``chars``) a reader sent."""

    tokens: int = 0
    chars: int = 0
    primed: bool = False  # what came before the reader's first cursor is accounted for
    prompt_sent: bool = False
    # characters sent by the time the output first reached a position (an event boundary)
    _chars_at: dict[int, int] = field(default_factory=lambda: {0: 0})

    def see(self, msg: Message) -> None:
        """Account for ``msg`` as sent."""
        if not isinstance(msg, TokenEvent):
            return
        self.tokens = max(self.tokens, msg.index + len(msg.token_ids))
        self.chars += len(msg.text)
        self.prompt_sent = self.prompt_sent or msg.prompt_logprobs is not None
        self._chars_at.setdefault(self.tokens, self.chars)

    def unseen(self, msg: Message) -> Message | None:
        """``msg`` less what was sent already (None: nothing of it is new), marked as sent."""
        if isinstance(msg, TokenEvent):
            got = self._trimmed(msg)
            if got is None:
                return None
            msg = got
        self.see(msg)
        return msg

    def _trimmed(self, ev: TokenEvent) -> TokenEvent | None:
        end = ev.index + len(ev.token_ids)
        if ev.index >= self.tokens:
            return ev
        if end <= self.tokens:
            # Wholly sent already (text alone at a position already passed included).
            return None
        cut = self.tokens - ev.index
        update: dict[str, object] = {
            "index": self.tokens,
            "token_ids": ev.token_ids[cut:],
            "text": self._text_after(ev, cut),
        }
        if ev.logprobs is not None:
            update["logprobs"] = ev.logprobs.slice(cut)
        if self.prompt_sent:
            update["prompt_logprobs"] = None
        if ev.spec is not None:
            spans = [s for s in ev.spec.spans if s.token >= self.tokens]
            update["spec"] = Speculation(steps=_steps_after(ev.spec.steps, cut), spans=spans)
            update["text"] = "".join(s.text for s in spans)
        return ev.model_copy(update=update)

    def _text_after(self, ev: TokenEvent, cut: int) -> str:
        """``ev``'s text less the characters sent already: known when the event starts where
        an event this reader sent ended; else the whole text stands (nothing to cut by)."""
        start = self._chars_at.get(ev.index)
        if start is None:
            return ev.text
        return ev.text[max(0, self.chars - start) :]


def _steps_after(steps: list[SpecStep], cut: int) -> list[SpecStep]:
    """``steps`` less their first ``cut`` tokens (a step keeps what it has left of them)."""
    out: list[SpecStep] = []
    for s in steps:
        if cut >= s.tokens:
            cut -= s.tokens
            continue
        if cut:
            s = s.model_copy(update={"tokens": s.tokens - cut, "accepted": max(0, s.accepted - cut)})
            cut = 0
        out.append(s)
    return out
