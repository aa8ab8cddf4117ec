"""The streaming client against SSE bodies framed exactly as the gateway frames them."""

from __future__ import annotations

import json

import httpx
import pytest

from benchmarks.load.client import ClientOptions, RequestRecord, request_body, send
from benchmarks.load.plan import PlannedRequest
from benchmarks.load.workloads import WorkloadItem
from gateway import sse
from gateway.responses import ResponseBuilder
from shared.schemas import FinishEvent

REQ = PlannedRequest(0, 0.0, 0, WorkloadItem("q", "c", "Hello"), max_tokens=3, seed=11)


def gateway_stream(chat: bool, texts: list[str]) -> str:
    out = ResponseBuilder(chat, "job1", "m", include_usage=True)
    body = sse.KEEPALIVE + "".join(sse.data(out.chunk(t)) for t in texts)
    final = FinishEvent(job_id="job1", finish_reason="length", text="".join(texts), token_ids=[1, 2, 3],
                        prompt_tokens=5, completion_tokens=3)  # fmt: skip
    return body + sse.data(out.chunk("", "length")) + sse.data(out.usage_chunk(final)) + sse.DONE


def client_for(status: int, body: str, seen: list[dict[str, object]]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        return httpx.Response(status, text=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://test")


def test_request_body_fixes_length_and_asks_for_usage() -> None:
    body = request_body(REQ, ClientOptions())
    assert body["messages"] == [{"role": "user", "content": "Hello"}]
    assert (body["max_tokens"], body["ignore_eos"], body["seed"], body["temperature"]) == (3, True, 11, 0.0)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert request_body(REQ, ClientOptions(endpoint="completions"))["prompt"] == "Hello"


@pytest.mark.anyio
@pytest.mark.parametrize("chat", [True, False])
async def test_send_records_chunks_usage_and_finish(chat: bool) -> None:
    seen: list[dict[str, object]] = []
    rec = RequestRecord(0, 0, 0.0, 3)
    opts = ClientOptions(endpoint="chat" if chat else "completions")
    async with client_for(200, gateway_stream(chat, ["He", "ll", "o!"]), seen) as client:
        await send(client, REQ, opts, 0.0, rec)
    assert seen[0]["path"] == ("/v1/chat/completions" if chat else "/v1/completions")
    assert rec.ok, rec.error
    assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.finish_reason) == (200, 5, 3, "length")
    assert len(rec.chunk_s) == 3  # the finish and usage chunks carry no text
    assert rec.sent_s is not None and rec.first_token_s == rec.chunk_s[0]
    assert rec.end_s is not None and rec.end_s >= rec.chunk_s[-1]


@pytest.mark.anyio
async def test_send_records_http_and_stream_errors() -> None:
    rec = RequestRecord(0, 0, 0.0, 3)
    async with client_for(429, '{"error": {"message": "queue full"}}', []) as client:
        await send(client, REQ, ClientOptions(), 0.0, rec)
    assert not rec.ok and rec.status == 429 and "queue full" in (rec.error or "")

    rec = RequestRecord(0, 0, 0.0, 3)
    body = sse.data({"error": {"message": "engine died"}}) + sse.DONE
    async with client_for(200, body, []) as client:
        await send(client, REQ, ClientOptions(), 0.0, rec)
    assert rec.error == "stream error: engine died"

    rec = RequestRecord(0, 0, 0.0, 3)
    async with client_for(200, sse.data({"choices": [{"delta": {"content": "x"}}]}), []) as client:
        await send(client, REQ, ClientOptions(), 0.0, rec)
    assert rec.error == "stream ended without [DONE]"
