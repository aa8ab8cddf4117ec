"""OpenAI clients of the chaos suite: what each one was answered, as a user would see it.

Each request carries an ``Idempotency-Key``, so the test knows its job id before the answer
(``gateway.ids.idempotent_job_id``; the chaos gateway is open: owner ""). A client *failed*
when it got anything but a complete answer: a non-200 status, an error chunk, a transport
error, or a stream that did not end with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from gateway.ids import idempotent_job_id


@dataclass
class Answer:
    """What one OpenAI client got."""

    key: str
    stream: bool
    status: int | None = None  # None: no response (transport error)
    text: str = ""  # the completion's text, streamed chunks joined
    error: str | None = None  # the error code of an error body or chunk, or the exception's name
    retry_after: str | None = None
    done: bool = False  # a stream ended with [DONE]
    chunks: int = 0
    seconds: float = 0.0  # request to the end of the answer
    finish_reasons: list[str] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        job_id = idempotent_job_id("", self.key)
        assert job_id is not None
        return job_id

    @property
    def failed(self) -> bool:
        if self.stream:
            return self.status != 200 or self.error is not None or not self.done
        return self.status != 200 or self.error is not None


def completion_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, object]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}  # fmt: skip


async def complete(base_url: str, key: str, prompt: str, max_tokens: int, stream: bool) -> Answer:
    """One /v1/completions request, streamed or not, read to its end."""
    a = Answer(key, stream)
    body = completion_body(prompt, max_tokens, stream)
    t0 = time.monotonic()
    try:
        headers = {"Idempotency-Key": key}
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(180.0)) as client,
            client.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
        ):
            a.status = resp.status_code
            a.retry_after = resp.headers.get("retry-after")
            if stream and resp.status_code == 200:
                async for line in resp.aiter_lines():
                    _chunk(a, line)
            else:
                _whole(a, json.loads(await resp.aread()))
    except (httpx.HTTPError, ValueError) as exc:
        a.error = a.error or type(exc).__name__
    a.seconds = time.monotonic() - t0
    return a


def _chunk(a: Answer, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        a.done = True
        return
    a.chunks += 1
    got = json.loads(data)
    if "error" in got:
        a.error = str(got["error"].get("code"))
        return
    for choice in got.get("choices", []):
        a.text += choice.get("text") or ""
        if choice.get("finish_reason"):
            a.finish_reasons.append(choice["finish_reason"])


def _whole(a: Answer, got: dict[str, object]) -> None:
    if "error" in got:
        err = got["error"]
        a.error = str(err.get("code")) if isinstance(err, dict) else "error"
        return
    choices = got.get("choices")
    assert isinstance(choices, list)
    a.text = "".join(str(c.get("text") or "") for c in choices)
    a.finish_reasons = [str(c.get("finish_reason")) for c in choices]
