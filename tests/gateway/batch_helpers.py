"""Helpers of the batch tests (test_batches.py, test_batch_band.py)."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import MODEL


def _req(custom_id: str, content: str, url: str = "/v1/chat/completions", **body: object) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": MODEL, "messages": [{"role": "user", "content": content}], **body},
    }


async def _upload(
    gw: httpx.AsyncClient, content: bytes, purpose: str = "batch", **kw: object
) -> httpx.Response:
    return await gw.post("/v1/files", data={"purpose": purpose}, files={"file": ("in.jsonl", content)}, **kw)  # type: ignore[arg-type]
