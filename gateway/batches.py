"""OpenAI's Batch API over the job queue: files in Redis, a batch = one job per input line.

- A file (``POST /v1/files``, purpose ``batch``, JSONL) is a hash ``keys.file_key`` with its
  owner and content, expiring with the result TTL; its size is bounded by the body limit.
- A batch (``POST /v1/batches``) validates every line as its endpoint's request, enqueues one
  job per valid line (job id ``<batch id>-<line>``) on the model's batch band
  (``keys.batch_stream``: bounded by ``--max-batch-queue``, never counted against
  ``--max-queue``; a worker moves its jobs onto the job stream only while no live job waits,
  worker/intake.py ``promote_batch``), and records the lines that failed.
- Its state is computed when read: the jobs' statuses give ``request_counts``; once every
  job is over the output and error files are written (OpenAI's line format:
  ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``)
  and the batch is ``completed`` (or ``cancelled`` after ``POST .../cancel``). Finishing
  twice (two readers at once) writes the same files under the same ids.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import Any

from pydantic import ValidationError

from gateway.errors import APIError, from_validation
from gateway.openai_schema import ChatRequest, CompletionRequest
from gateway.responses import ResponseBuilder
from gateway.store import JobStore
from gateway.submission import capacity, fit_max_tokens
from shared import codec, jobs, keys
from shared.errors import ErrorCode, http_status
from shared.schemas import ErrorEvent, FinishEvent, FinishReason, JobRequest

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_LINES = 50_000
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError.of(ErrorCode.BAD_REQUEST, message, param=param)


def _t(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ----------------------------------------------------------------------------- files


def file_object(file_id: str, fields: dict[str, Any]) -> dict[str, Any]:
    created = int(float(_t(fields.get("created_at", b"0"))))
    return {
        "id": file_id,
        "object": "file",
        "bytes": int(_t(fields.get("bytes", b"0"))),
        "created_at": created,
        "expires_at": int(float(_t(fields.get("expires_at", b"0")))) or None,
        "filename": _t(fields.get("filename", b"")),
        "purpose": _t(fields.get("purpose", b"")),
        "status": "processed",
        "status_details": None,
    }


async def put_file(
    store: JobStore, owner: str, filename: str, purpose: str, content: bytes, file_id: str | None = None
) -> dict[str, Any]:
    file_id = file_id or "file-" + secrets.token_hex(12)
    now = time.time()
    ttl = max(1, int(store.settings.result_ttl_s))
    fields = {
        "owner": owner,
        "purpose": purpose,
        "filename": filename[:255],
        "bytes": str(len(content)),
        "created_at": repr(now),
        "expires_at": repr(now + ttl),
        "content": content,
    }
    async with store.r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.file_key(file_id), mapping=fields)  # type: ignore[arg-type]
        pipe.expire(keys.file_key(file_id), ttl)
        await pipe.execute()
    return file_object(file_id, fields)


async def get_file(store: JobStore, owner: str, file_id: str) -> dict[str, Any]:
    """The file's fields (404 when unknown, expired or another owner's)."""
    raw = await store.r.hgetall(keys.file_key(file_id)) if _valid_id(file_id) else {}
    fields = {_t(k): v for k, v in raw.items()}
    if not fields or _t(fields.get("owner", b"")) != owner:
        raise APIError.of(ErrorCode.NOT_FOUND, f"No such File object: {file_id[:80]}", param="file_id")
    return fields


def _valid_id(value: str) -> bool:
    return 0 < len(value) <= 128 and all(c.isalnum() or c in "-_" for c in value)


# --------------------------------------------------------------------------- batches


async def _job_for(store: JobStore, endpoint: str, body: Any, job_id: str) -> JobRequest:
    """The job of one input line, checked as its endpoint checks a request (APIError)."""
    if not isinstance(body, dict):
        raise _bad("body must be a JSON object", "body")
    try:
        req: ChatRequest | CompletionRequest = (
            ChatRequest.model_validate(body)
            if endpoint == "/v1/chat/completions"
            else CompletionRequest.model_validate(body)
        )
    except ValidationError as exc:
        raise from_validation(exc) from None
    req.check_supported()
    if req.n != 1 or req.stream:
        raise _bad("batch requests take n = 1 and no stream", "n")
    if isinstance(req, ChatRequest):
        given = req.max_completion_tokens or req.max_tokens
        inputs: dict[str, Any] = {"messages": req.chat_messages(), "tools": req.template_tools()}
        max_tokens = given or store.settings.default_max_tokens
    else:
        prompts = req.prompt_inputs()
        if len(prompts) != 1:
            raise _bad("batch requests take one prompt each", "prompt")
        inputs, given = prompts[0], req.max_tokens
        max_tokens = given or COMPLETIONS_DEFAULT_MAX_TOKENS
    cap = await capacity(store, None, req.model)
    ids = inputs.get("prompt_token_ids")
    max_tokens = fit_max_tokens(cap, max_tokens, given is not None, len(ids) if ids is not None else None)
    try:
        return JobRequest(
            job_id=job_id,
            model=cap.model,
            params=req.sampling(max_tokens),
            priority=req.priority,
            output_kind="final_only",  # read only once done
            **inputs,
        )
    except (ValidationError, ValueError) as exc:
        raise _bad(str(exc)) from None


async def create(
    store: JobStore,
    owner: str,
    input_file_id: str,
    endpoint: str,
    window: str,
    metadata: dict[str, str] | None,
) -> dict[str, Any]:
    if endpoint not in ENDPOINTS:
        raise _bad(f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
    if window != "24h":
        raise _bad("completion_window must be 24h", "completion_window")
    f = await get_file(store, owner, input_file_id)
    if _t(f.get("purpose", b"")) != "batch":
        raise _bad("the input file's purpose must be batch", "input_file_id")
    text = f.get("content", b"")
    lines = [
        ln
        for ln in (text if isinstance(text, bytes) else text.encode()).decode("utf-8", "replace").splitlines()
        if ln.strip()
    ]
    if not 1 <= len(lines) <= MAX_LINES:
        raise _bad(f"the input file must hold 1 to {MAX_LINES} requests", "input_file_id")
    batch_id = "batch_" + secrets.token_hex(12)
    requests: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, line in enumerate(lines):
        try:
            item = json.loads(line)
        except ValueError:
            raise _bad(f"line {i + 1} is not JSON", "input_file_id") from None
        if not isinstance(item, dict):
            raise _bad(f"line {i + 1} is not a JSON object", "input_file_id")
        custom = item.get("custom_id")
        if not isinstance(custom, str) or not custom or custom in seen:
            raise _bad(f"line {i + 1}: each request needs a unique custom_id", "input_file_id")
        seen.add(custom)
        if item.get("url") != endpoint or item.get("method", "POST") != "POST":
            raise _bad(
                f"line {i + 1}: url must be the batch's endpoint {endpoint} (method POST)", "input_file_id"
            )
        requests.append({"custom_id": custom, "body": item.get("body")})
    now = time.time()
    record: dict[str, Any] = {
        "id": batch_id,
        "endpoint": endpoint,
        "input_file_id": input_file_id,
        "completion_window": window,
        "created_at": int(now),
        "in_progress_at": int(now),
        "expires_at": int(now + 24 * 3600),
        "metadata": metadata or None,
        "status": "in_progress",
        "requests": [],
    }
    for i, req in enumerate(requests):
        job_id = f"{batch_id}-{i}"
        entry: dict[str, Any] = {"custom_id": req["custom_id"], "job_id": None, "error": None}
        try:
            job = await _job_for(store, endpoint, req["body"], job_id)
            await store.submit(job, owner=owner, fingerprint=f"batch:{batch_id}:{i}", batch=True)
            entry["job_id"], entry["model"] = job_id, job.model
        except APIError as err:
            entry["error"] = {"status": err.status, "body": err.body()}
        record["requests"].append(entry)
    await _save(store, owner, record)
    return await view(store, owner, batch_id)


async def _save(store: JobStore, owner: str, record: dict[str, Any]) -> None:
    ttl = max(1, int(store.settings.result_ttl_s))
    async with store.r.pipeline(transaction=False) as pipe:
        pipe.hset(keys.batch_key(record["id"]), mapping={"owner": owner, "record": json.dumps(record)})
        pipe.expire(keys.batch_key(record["id"]), ttl)
        pipe.zadd(keys.owner_batches(owner), {record["id"]: record["created_at"]})
        pipe.expire(keys.owner_batches(owner), ttl)
        await pipe.execute()


async def _load(store: JobStore, owner: str, batch_id: str) -> dict[str, Any]:
    raw = await store.r.hgetall(keys.batch_key(batch_id)) if _valid_id(batch_id) else {}
    fields = {_t(k): v for k, v in raw.items()}
    if not fields or _t(fields.get("owner", b"")) != owner:
        raise APIError.of(ErrorCode.NOT_FOUND, f"No such Batch object: {batch_id[:80]}", param="batch_id")
    record: dict[str, Any] = json.loads(_t(fields["record"]))
    return record


async def _finals(store: JobStore, record: dict[str, Any]) -> list[FinishEvent | ErrorEvent | None]:
    """Each request's final event (None: not over yet, or never enqueued), in one round trip."""
    entries = record["requests"]
    async with store.r.pipeline(transaction=False) as pipe:
        for e in entries:
            if e["job_id"]:
                pipe.hget(keys.job_key(e.get("model", ""), e["job_id"]), jobs.RESULT)
        raw = iter(await pipe.execute())
    out: list[FinishEvent | ErrorEvent | None] = []
    for e in entries:
        got = next(raw) if e["job_id"] else None
        msg = None
        if got is not None:
            with contextlib.suppress(codec.CodecError):
                msg = codec.decode(got if isinstance(got, bytes) else str(got).encode())
        out.append(msg if isinstance(msg, FinishEvent | ErrorEvent) else None)
    return out


async def view(store: JobStore, owner: str, batch_id: str) -> dict[str, Any]:
    """The batch object, brought up to date (finished when every job is over)."""
    record = await _load(store, owner, batch_id)
    finals = await _finals(store, record)
    total = len(record["requests"])
    ok = sum(isinstance(f, FinishEvent) and f.finish_reason != FinishReason.CANCELLED for f in finals)
    failed = sum(
        1 for e, f in zip(record["requests"], finals, strict=True) if e["error"] or isinstance(f, ErrorEvent)
    )
    over = all(e["error"] or f is not None for e, f in zip(record["requests"], finals, strict=True))
    if record["status"] in ("in_progress", "cancelling") and over:
        await _finish(store, owner, record, finals)
    out = {k: v for k, v in record.items() if k != "requests"}
    out.update(
        object="batch", errors=None, request_counts={"total": total, "completed": ok, "failed": failed}
    )
    for k in (
        "output_file_id",
        "error_file_id",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
    ):
        out.setdefault(k, None)
    return out


async def _finish(
    store: JobStore, owner: str, record: dict[str, Any], finals: list[FinishEvent | ErrorEvent | None]
) -> None:
    chat = record["endpoint"] == "/v1/chat/completions"
    outputs, errors = [], []
    for i, (entry, final) in enumerate(zip(record["requests"], finals, strict=True)):
        line: dict[str, Any] = {
            "id": f"batch_req_{record['id'][6:]}_{i}",
            "custom_id": entry["custom_id"],
            "error": None,
        }
        if isinstance(final, FinishEvent) and final.finish_reason != FinishReason.CANCELLED:
            body = ResponseBuilder(chat, entry["job_id"], str(entry.get("model", ""))).full(final)
            line["response"] = {"status_code": 200, "request_id": entry["job_id"], "body": body}
            outputs.append(line)
            continue
        if entry["error"]:
            status, body = entry["error"]["status"], entry["error"]["body"]
        elif isinstance(final, ErrorEvent):
            status = http_status(final.code)
            body = {
                "error": {
                    "message": final.message,
                    "type": "invalid_request_error" if status < 500 else "server_error",
                    "param": None,
                    "code": final.code,
                }
            }
        else:
            status, body = (
                499,
                {
                    "error": {
                        "message": "the batch was cancelled",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "batch_cancelled",
                    }
                },
            )
        line["response"] = {"status_code": status, "request_id": entry["job_id"], "body": body}
        errors.append(line)
    now = int(time.time())
    rid = record["id"]
    if outputs:
        content = "".join(json.dumps(x) + "\n" for x in outputs).encode()
        record["output_file_id"] = (
            await put_file(store, owner, f"{rid}_output.jsonl", "batch_output", content, f"file-{rid}-output")
        )["id"]
    if errors:
        content = "".join(json.dumps(x) + "\n" for x in errors).encode()
        record["error_file_id"] = (
            await put_file(store, owner, f"{rid}_error.jsonl", "batch_output", content, f"file-{rid}-error")
        )["id"]
    record["finalizing_at"] = now
    if record["status"] == "cancelling":
        record["status"], record["cancelled_at"] = "cancelled", now
    else:
        record["status"], record["completed_at"] = "completed", now
    await _save(store, owner, record)


async def cancel(store: JobStore, owner: str, batch_id: str) -> dict[str, Any]:
    record = await _load(store, owner, batch_id)
    if record["status"] == "in_progress":
        record["status"], record["cancelling_at"] = "cancelling", int(time.time())
        await _save(store, owner, record)
        for entry in record["requests"]:
            if entry["job_id"]:
                await store.request_cancel(entry["job_id"])
    return await view(store, owner, batch_id)


async def page(store: JobStore, owner: str, limit: int, after: str | None) -> dict[str, Any]:
    key = keys.owner_batches(owner)
    start = 0
    if after is not None:
        rank = await store.r.zrevrank(key, after) if _valid_id(after) else None
        if rank is None:
            return {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
        start = int(rank) + 1  # type: ignore[arg-type]
    ids = [_t(x) for x in await store.r.zrevrange(key, start, start + limit - 1)]
    data = []
    for batch_id in ids:
        try:
            data.append(await view(store, owner, batch_id))
        except APIError:
            continue
    more = start + len(ids) < int(await store.r.zcard(key))
    return {
        "object": "list",
        "data": data,
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
        "has_more": more,
    }
