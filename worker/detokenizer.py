"""From generated token ids to released text: incremental decoding and stop strings.

Two layers, both per job:

* :class:`IncrementalDetokenizer` turns one token at a time into a text delta. It decodes a
  short window of tokens so that tokenizers which render a token differently in context
  (SentencePiece's leading space) come out right, and holds text back while it ends in an
  incomplete UTF-8 sequence (decoded as U+FFFD). A Hugging Face fast tokenizer does this in
  Rust (``tokenizers.decoders.DecodeStream``, the same algorithm, one decode a token instead
  of two from Python) whenever that gives the same text: no clean-up of spaces, and a prompt
  context that decodes without U+FFFD (DecodeStream would release a broken character of the
  prompt with the first token). Otherwise, and from any error of the stream on, the window
  is decoded here.
* :class:`StopText` finds stop strings across deltas. Text that could still be the start of
  a stop string is held back; when a stop string appears, the text is cut before it.
"""

from __future__ import annotations

from typing import Any, Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, for in-context rendering


class Decoder(Protocol):
    """What is needed of a tokenizer (a transformers tokenizer fits)."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = ..., **kwargs: Any) -> Any: ...


class IncrementalDetokenizer:
    """Feeds on token ids, returns the text each one completes."""

    def __init__(self, tokenizer: Decoder, prompt_ids: list[int]) -> None:
        self._tok = tokenizer
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix = 0  # start of the decoding window
        self._read = len(self._ids)  # tokens before this are already rendered
        self._backend: Tokenizer | None = None
        self._stream: DecodeStream | None = None
        backend = getattr(tokenizer, "_tokenizer", None)
        if (
            isinstance(backend, Tokenizer)
            and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
            and REPLACEMENT not in self._decode(self._ids)
        ):
            self._backend = backend
            self._stream = DecodeStream(ids=list(self._ids), skip_special_tokens=True)

    def _decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        if self._stream is not None and self._backend is not None:
            try:
                text = self._stream.step(self._backend, token_id)
            except Exception:  # the stream's own error: the window is decoded here from now on
                self._stream = None
            else:
                if not text:
                    return ""
                self._prefix, self._read = self._read, len(self._ids)  # as below: flush needs them
                return str(text)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT):
            return ""  # nothing visible yet, or a multi-byte character is still incomplete
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held (an incomplete character renders as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]


class StopText:
    """Accumulates text, cuts it at the first stop string, releases what is safe to show."""

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self.text = ""  # everything accepted so far (cut at the stop once one is found)
        self.released = 0  # characters of ``text`` already handed out
        self.stopped = False

    def push(self, delta: str) -> str:
        """Add decoded text; return the newly releasable part."""
        if self.stopped or not delta:
            return ""
        search_from = max(0, len(self.text) - self._longest + 1)
        self.text += delta
        hits = [i for s in self._stops if (i := self.text.find(s, search_from)) != -1]
        if hits:
            self.stopped = True
            self.text = self.text[: min(hits)]
            return self._release(len(self.text))
        return self._release(len(self.text) - self._held_back())

    def flush(self) -> str:
        """Release the held-back tail: generation ended without completing a stop string."""
        return self._release(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest tail of ``text`` that begins some stop string."""
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0

    def _release(self, upto: int) -> str:
        if upto <= self.released:
            return ""
        out = self.text[self.released : upto]
        self.released = upto
        return out
