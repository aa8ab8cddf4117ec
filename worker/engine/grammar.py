"""Structured output in the engine: a grammar's token mask on the target's logits rows.

A constrained sequence holds a ``Constraint``: an llguidance matcher at the state after its
output so far. Its rows are masked in ``processors.process_rows`` (before verification):
row i, which scores the position after the first i drafts, gets the mask of the state after
consuming drafts 1..i-1 and i — the matcher walks the drafted path and rolls back what it
walked, so the rows are exactly those the target alone would see if the drafts were its own
tokens. A draft the grammar forbids has probability 0 under its row's mask: greedy
verification never accepts it (the masked argmax differs), nor keyed verification (the masked
draw never picks it), nor rejection sampling (``verify.verify_sampled`` accepts only where
p > 0), so the rows after it are never used and are left unmasked. Hence greedy output under
any γ and drafter equals the target's own with the same grammar, a seeded sampled one too,
and unseeded sampled output keeps the masked target distribution.

After verification ``accept`` consumes the tokens that stand and cuts them after the token
that ends the grammar (EOS is allowed only where the grammar accepts); the sequence then
finishes with "stop". A step that fails rolls the matcher back with the tokens (``sync``).
Drafting cuts point-mass drafts (greedy sequences, the n-gram drafter) and a seeded
sequence's keyed drafts at the first the grammar forbids (``fitting``), so no row is spent
verifying what would be rejected: exact, since rejecting such a draft leaves the target's
token to the row where it stands (greedy: its masked argmax; keyed: its masked draw, which a
forbidden token never is; rejection sampling: the residual of a point mass of probability 0
there is the row itself). Drafts an unseeded sequence sampled from a drafter's distribution q
are not cut: dropping a draft changes the rejection branch's residual, so they are rejected
by verification instead.
Sequences without a grammar never reach this module.

``Grammars`` compiles: the llguidance tokenizer is built from the engine's tokenizer on the
first constrained request, each constraint once (a pristine matcher per
``StructuredOutput.key()``, deep-copied for every sequence).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

import llguidance
import llguidance.hf
import numpy as np
import torch

from shared.errors import ErrorCode
from shared.grammar import grammar_text
from shared.schemas import FinishReason
from shared.structured import StructuredOutput

if TYPE_CHECKING:
    from worker.engine.api import EngineRequest

CACHED_GRAMMARS = 256


class GrammarError(ValueError):
    """The request's constraint cannot be compiled or run: the request's fault (400)."""


class Constraint:
    """One sequence's matcher; ``consumed`` counts the output tokens it has taken."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher, self.vocab_size, self.consumed = matcher, vocab_size, 0

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but EOS may follow."""
        return bool(self.matcher.is_stopped())

    def allowed(self) -> torch.Tensor:
        """``[V]`` bool: the tokens the grammar allows next."""
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")
        out = torch.from_numpy(mask)
        if out.shape[0] < self.vocab_size:  # the model's rows are wider than the tokenizer
            out = torch.cat([out, torch.zeros(self.vocab_size - out.shape[0], dtype=torch.bool)])
        return out

    def mask_rows(self, rows: torch.Tensor, drafts: list[int], raw: torch.Tensor) -> None:
        """Mask ``rows`` ([k+1, V], processed; ``raw`` unprocessed) in place along the drafted
        path (see the module docstring). Where the processors left no token the grammar
        allows (``min_tokens`` banning the only EOS a finished grammar takes), the grammar
        wins over them."""
        walked = 0
        try:
            for i in range(rows.shape[0]):
                if self.matcher.is_stopped():
                    break
                ok = self.allowed().to(rows.device)
                row = rows[i].masked_fill(~ok, float("-inf"))
                if not bool(torch.isfinite(row).any()):
                    row = raw[i].to(rows.dtype).masked_fill(~ok, float("-inf"))
                rows[i] = row
                if i == len(drafts) or not bool(ok[drafts[i]]):
                    break  # past the last draft, or a draft the grammar refuses: rows after it are unused
                if not self.matcher.consume_token(drafts[i]):
                    raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")
                walked += 1
        finally:
            if walked:
                self.matcher.rollback(walked)

    def fitting(self, drafts: list[int]) -> int:
        """How many of the drafts the grammar allows in a row (the matcher is unchanged)."""
        return int(self.matcher.validate_tokens(drafts)) if drafts else 0

    def accept(self, tokens: list[int]) -> int:
        """Consume the tokens that stand; how many of them do (all, or up to the one that
        completes the grammar)."""
        for j, t in enumerate(tokens):
            if not self.matcher.consume_token(t):
                raise GrammarError(f"token {t} does not fit the grammar: {self.matcher.get_error()}")
            self.consumed += 1
            if self.matcher.is_stopped():
                return j + 1
        return len(tokens)

    def sync(self, num_output: int) -> None:
        """Roll back to the sequence's output length (after a failed step dropped tokens)."""
        if self.consumed > num_output:
            self.matcher.rollback(self.consumed - num_output)
            self.consumed = num_output


class Constrained(Protocol):
    """What ``Grammars.attach`` needs of a sequence (worker/engine/sequence.py's ``Sequence``,
    which imports this module: a protocol keeps the import one way)."""

    grammar: Constraint | None

    def finish(self, reason: FinishReason) -> None: ...

    def fail(self, code: ErrorCode, message: str) -> None: ...


class Grammars:
    """The constraints of one engine: its tokenizer, its vocabulary, its EOS ids."""

    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    def attach(self, seq: Constrained, req: EngineRequest, tokenizer: Any) -> bool:
        """Give a new sequence its constraint (``req.params.structured``); False when the
        sequence is over already: failed (a constraint the grammar engine refuses: the
        request's fault) or finished (the output sent before a failover completed it)."""
        assert req.params.structured is not None
        ids = req.prompt_token_ids
        try:
            seq.grammar = self.start(req.params.structured, tokenizer, ids[len(ids) - req.resumed :])
        except GrammarError as exc:
            seq.fail(ErrorCode.BAD_REQUEST, str(exc))
            return False
        if seq.grammar.done:
            seq.finish(FinishReason.STOP)
            return False
        return True

    def start(self, spec: StructuredOutput, tokenizer: Any, prefix: list[int]) -> Constraint:
        """A constraint for a new sequence, after ``prefix`` (output an earlier attempt sent)."""
        with self._lock:
            pristine = self._matcher(spec, tokenizer)
        c = Constraint(pristine.deep_copy(), self.vocab_size)
        if prefix and c.accept(prefix) < len(prefix):
            raise GrammarError("the output already sent goes past the end of the grammar")
        c.consumed = 0  # the prefix is the engine's prompt, not output
        return c

    def _matcher(self, spec: StructuredOutput, tokenizer: Any) -> llguidance.LLMatcher:
        key = spec.key()
        if key in self._compiled:
            self._compiled.move_to_end(key)
            return self._compiled[key]
        m = llguidance.LLMatcher(self._llg_tokenizer(tokenizer), grammar_text(spec), log_level=0)
        if m.is_error():
            raise GrammarError(f"the grammar engine refused the constraint: {m.get_error()}"[:2000])
        self._compiled[key] = m
        while len(self._compiled) > CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return m

    def _llg_tokenizer(self, tokenizer: Any) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            if tokenizer is None:
                raise GrammarError("this model has no tokenizer: structured output is not available")
            try:
                n_vocab = max(self.vocab_size, len(tokenizer))
                self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab, self.eos or None)
            except ValueError as exc:  # not a fast tokenizer
                raise GrammarError(f"structured output is not available for this tokenizer: {exc}") from None
        return self._tokenizer
