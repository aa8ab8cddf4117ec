"""OpenAI's Files and Batch routes (gateway/batches.py does the work).

``POST /v1/files`` (multipart: ``purpose`` = batch, ``file`` = JSONL; parsed with the
standard library, bounded by the body limit), ``GET /v1/files/{id}``,
``GET /v1/files/{id}/content``; ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``GET /v1/batches``, ``POST /v1/batches/{id}/cancel``. Only their owner sees them.
"""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from gateway import batches, webhooks
from gateway.auth import owner
from gateway.errors import APIError
from gateway.store import JobStore
from shared.errors import ErrorCode

router = APIRouter()


def _store(request: Request) -> JobStore:
    store: JobStore = request.app.state.store
    return store


def _form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """name -> (filename, bytes) of a multipart/form-data body."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise APIError.of(ErrorCode.BAD_REQUEST, "send the file as multipart/form-data", param="file")
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    msg = BytesParser(policy=HTTP).parsebytes(head + body)
    out: dict[str, tuple[str | None, bytes]] = {}
    parts = msg.iter_parts() if msg.is_multipart() else []
    for part in parts:
        assert isinstance(part, Message)
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            out[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return out


@router.post("/v1/files")
async def upload(request: Request) -> dict[str, Any]:
    form = _form(request.headers.get("content-type", ""), await request.body())
    purpose = form.get("purpose", (None, b""))[1].decode("utf-8", "replace").strip()
    if purpose != "batch":
        raise APIError.of(ErrorCode.BAD_REQUEST, "purpose must be batch", param="purpose")
    if "file" not in form:
        raise APIError.of(ErrorCode.BAD_REQUEST, "a file part is required", param="file")
    filename, content = form["file"]
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError.of(ErrorCode.BAD_REQUEST, "the file must be UTF-8 JSONL", param="file") from None
    return await batches.put_file(
        _store(request), owner(request), filename or "upload.jsonl", purpose, content
    )


@router.get("/v1/files/{file_id}")
async def file_info(file_id: str, request: Request) -> dict[str, Any]:
    return batches.file_object(file_id, await batches.get_file(_store(request), owner(request), file_id))


@router.get("/v1/files/{file_id}/content", response_model=None)
async def file_content(file_id: str, request: Request) -> Response:
    fields = await batches.get_file(_store(request), owner(request), file_id)
    content = fields.get("content", b"")
    return Response(
        content if isinstance(content, bytes) else str(content).encode(), media_type="application/jsonl"
    )


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input_file_id: str = Field(max_length=128)
    endpoint: str = Field(max_length=64)
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    webhook_url: str | None = None  # Nightjar's: POSTed the batch once it is over (signed)


@router.post("/v1/batches")
async def create_batch(body: BatchCreate, request: Request) -> dict[str, Any]:
    url = webhooks.check_url(body.webhook_url)
    store, who = _store(request), owner(request)
    batch = await batches.create(
        store, who, body.input_file_id, body.endpoint, body.completion_window, body.metadata
    )
    if url is not None:
        await webhooks.register(store, "batch", batch["id"], url, who)
    return batch


@router.get("/v1/batches/{batch_id}")
async def get_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return await batches.view(_store(request), owner(request), batch_id)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return await batches.cancel(_store(request), owner(request), batch_id)


@router.get("/v1/batches")
async def list_batches(
    request: Request,
    limit: int = Query(default=20, ge=1, le=100),
    after: str | None = Query(default=None, max_length=128),
) -> dict[str, Any]:
    return await batches.page(_store(request), owner(request), limit, after)
