"""OpenAI's two logprobs shapes, from the workers' column form (``shared.schemas.Logprobs``).

- /v1/completions (``logprobs: k``): ``{"tokens", "token_logprobs", "top_logprobs",
  "text_offset"}``; ``top_logprobs[i]`` maps token text to logprob for the top k and the
  chosen token (so up to k + 1 entries, as OpenAI and vLLM); a prompt's first token (echo)
  has ``None`` for both. ``text_offset`` counts characters of the tokens' own texts from the
  start of the choice's text.
- /v1/chat/completions (``logprobs: true, top_logprobs: k``): ``{"content": [{"token",
  "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, …k]}], "refusal":
  None}``; ``bytes`` is the UTF-8 of the token's text.
"""

from __future__ import annotations

from typing import Any

from shared.schemas import Logprobs

UNKNOWN = -9999.0  # an output token sent without logprobs by an earlier attempt (chat wants a number)


def completion_logprobs(lp: Logprobs, offset: int = 0) -> tuple[dict[str, Any], int]:
    """The completions shape of ``lp``, its text offsets from ``offset``; and the offset
    after its last token (where a stream's next chunk goes on)."""
    offsets: list[int] = []
    tops: list[dict[str, float] | None] = []
    for i, token in enumerate(lp.tokens):
        offsets.append(offset)
        offset += len(token)
        value = lp.logprobs[i]
        if value is None:
            tops.append(None)
            continue
        top = dict(zip(lp.top_tokens[i], lp.top_logprobs[i], strict=True)) if i < len(lp.top_tokens) else {}
        top[token] = value  # the chosen token's own (two tokens may render alike, e.g. as U+FFFD)
        tops.append(top)
    body = {
        "tokens": list(lp.tokens),
        "token_logprobs": list(lp.logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset


def _entry(token: str, logprob: float | None) -> dict[str, Any]:
    return {"token": token, "logprob": UNKNOWN if logprob is None else logprob, "bytes": list(token.encode())}


def chat_logprobs(lp: Logprobs) -> dict[str, Any]:
    """The chat shape of ``lp``."""
    content = []
    for i, token in enumerate(lp.tokens):
        item = _entry(token, lp.logprobs[i])
        tops = zip(lp.top_tokens[i], lp.top_logprobs[i], strict=True) if i < len(lp.top_tokens) else []
        item["top_logprobs"] = [_entry(t, v) for t, v in tops]
        content.append(item)
    return {"content": content, "refusal": None}
