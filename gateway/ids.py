"""Job ids: generated, client-chosen or derived from an Idempotency-Key; and request fingerprints.

An id becomes part of Redis keys (``nj:job:{id}``, ``nj:job:{id}:events``), so only ids of
``[A-Za-z0-9_-]{1,64}`` are ever used: anything else in a path is simply an unknown job (404),
never a lookup of some other key.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from gateway.errors import APIError
from shared.errors import ErrorCode

MAX_ID_LEN = 64
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_IDEMPOTENCY_KEY_LEN = 256
IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_job_id() -> str:
    return uuid.uuid4().hex


def valid_job_id(value: str) -> bool:
    return bool(_ID.match(value))


def job_not_found(job_id: str) -> APIError:
    shown = job_id if valid_job_id(job_id) else repr(job_id[:80])
    return APIError.of(ErrorCode.JOB_NOT_FOUND, f"no job {shown}", param="id")


def client_job_id(value: str) -> str:
    """A client-chosen job id, validated (400 otherwise)."""
    if not valid_job_id(value):
        raise APIError.of(ErrorCode.BAD_REQUEST, "id must be 1-64 characters of A-Z a-z 0-9 _ -", param="id")
    return value


def idempotent_job_id(owner: str, key: str | None) -> str | None:
    """The job id an Idempotency-Key stands for: the same for the same key of the same API
    key (so a retry after a lost reply finds the job), different across API keys."""
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LEN or not key.isprintable():
        raise APIError.of(
            ErrorCode.BAD_REQUEST,
            f"{IDEMPOTENCY_HEADER} must be 1-{MAX_IDEMPOTENCY_KEY_LEN} printable characters",
            param=IDEMPOTENCY_HEADER,
        )
    return "idem-" + hashlib.sha256(f"{owner}\n{key}".encode()).hexdigest()[:40]


def fingerprint(route: str, request: Any) -> str:
    """A digest of what was asked (route and the request's fields): a reused job id with
    another fingerprint is a 409."""
    canon = json.dumps([route, request], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:32]
