"""The load client: one streamed OpenAI-compatible request, timed from its SSE chunks.

Times are ``time.perf_counter()`` readings taken as bytes arrive, stored as seconds after
the run's start. A chunk with text counts as a token arrival; a chunk may carry several
tokens (a speculative step emits them together), so per-token time (TPOT) is the decode
span divided by the tokens the usage chunk reports, and the chunk gaps are kept as well.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.load.plan import PlannedRequest


@dataclass
class RequestRecord:
    index: int
    window: int
    arrival_s: float  # when the plan wanted it sent
    max_tokens: int
    sent_s: float | None = None
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with text
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    status: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_s is not None

    @property
    def ttft(self) -> float | None:
        if self.sent_s is None or self.first_token_s is None:
            return None
        return self.first_token_s - self.sent_s

    @property
    def e2e(self) -> float | None:
        return None if self.sent_s is None or self.end_s is None else self.end_s - self.sent_s

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token_s is None or not self.chunk_s or self.completion_tokens < 2:
            return None
        return (self.chunk_s[-1] - self.first_token_s) / (self.completion_tokens - 1)


@dataclass(frozen=True)
class ClientOptions:
    endpoint: str = "chat"  # "chat" (/v1/chat/completions) or "completions" (/v1/completions)
    temperature: float = 0.0
    ignore_eos: bool = True
    model: str | None = None


def request_body(req: PlannedRequest, opts: ClientOptions) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": req.max_tokens,
        "temperature": opts.temperature,
        "ignore_eos": opts.ignore_eos,
        "seed": req.seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.model:
        body["model"] = opts.model
    if endpoint_of(req, opts) == "chat":
        body["messages"] = [{"role": "user", "content": req.item.prompt}]
    else:
        body["prompt"] = req.item.prompt
    return body


def endpoint_of(req: PlannedRequest, opts: ClientOptions) -> str:
    """The item's own endpoint (raw-text content goes to completions), else the run's."""
    return req.item.endpoint or opts.endpoint


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


async def send(
    client: httpx.AsyncClient, req: PlannedRequest, opts: ClientOptions, t0: float, rec: RequestRecord
) -> None:
    """Stream ``req`` and fill ``rec`` in place (so a cancelled request keeps what it got)."""
    path = "/v1/chat/completions" if endpoint_of(req, opts) == "chat" else "/v1/completions"
    rec.sent_s = time.perf_counter() - t0
    try:
        async with client.stream("POST", path, json=request_body(req, opts)) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                await resp.aread()
                rec.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return
            async for line in resp.aiter_lines():
                now = time.perf_counter() - t0
                if not line.startswith("data: "):
                    continue  # blank separators and keep-alive comments
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    rec.end_s = now
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    rec.error = f"stream error: {chunk['error'].get('message')}"
                    return
                if _chunk_text(chunk):
                    rec.chunk_s.append(now)
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                for choice in chunk.get("choices") or []:
                    rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = int(usage.get("prompt_tokens", 0))
                    rec.completion_tokens = int(usage.get("completion_tokens", 0))
        if rec.end_s is None:
            rec.error = "stream ended without [DONE]"
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    except ValueError as exc:  # a chunk that is not JSON
        rec.error = f"bad chunk: {exc}"
