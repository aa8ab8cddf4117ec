"""One vocabulary of failure, from the engine to HTTP.

Every ``ErrorEvent.code``, every ``APIError.code`` the gateway sends and every engine-side
failure of one request is an ``ErrorCode``; ``HTTP_STATUS`` is the one table that maps a
code to the HTTP status a client sees (the gateway reads it; nothing else decides a status).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # The request's fault: 4xx.
    BAD_REQUEST = "bad_request"  # invalid parameters, a template or tokenizer failure
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # prompt + max_tokens > the model's context
    UNAUTHORIZED = "unauthorized"  # no or unknown API key
    FORBIDDEN = "forbidden"  # a wrong admin token
    NOT_FOUND = "not_found"  # an unknown route
    JOB_NOT_FOUND = "job_not_found"  # unknown, expired, or another key's job
    MODEL_NOT_FOUND = "model_not_found"
    CONFLICT = "conflict"  # an Idempotency-Key or job id reused for a different request
    PAYLOAD_TOO_LARGE = "payload_too_large"
    QUEUE_FULL = "queue_full"  # admission: too many jobs waiting or running
    RATE_LIMITED = "rate_limited"  # one API key sent too many requests
    # The server's fault: 5xx.
    ENGINE_ERROR = "engine_error"  # the engine failed on this request alone
    DEAD_LETTER = "dead_letter"  # started too many times without finishing
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"  # the job store (Redis) or every worker is unreachable
    ADMIN_DISABLED = "admin_disabled"  # an admin route while no admin token is configured
    TIMEOUT = "timeout"  # the request's deadline passed before it finished


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.JOB_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.ENGINE_ERROR: 500,
    ErrorCode.DEAD_LETTER: 500,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.ADMIN_DISABLED: 403,  # closed until configured: the client cannot fix it by retrying
    ErrorCode.TIMEOUT: 504,
}


def http_status(code: str) -> int:
    """The HTTP status for ``code``; an unknown code is the server's fault (500)."""
    try:
        return HTTP_STATUS[ErrorCode(code)]
    except ValueError:
        return 500
