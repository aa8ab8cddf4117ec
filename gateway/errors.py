"""Errors as JSON: OpenAI's shape {"error": {"message", "type", "param", "code"}} everywhere.

Every code is a ``shared.errors.ErrorCode`` and its HTTP status comes from
``shared.errors.http_status``. 429 and 503 carry ``Retry-After``. Nothing answers a plain-text
500: ``CatchAll`` (the outermost middleware) turns any unexpected exception into a JSON 500.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import ErrorCode, http_status

log = logging.getLogger("nightjar.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}
# Seconds a client should wait before retrying, per code (429 and 503 always carry one).
RETRY_AFTER_S = {
    ErrorCode.QUEUE_FULL: 1,
    ErrorCode.RATE_LIMITED: 1,
    ErrorCode.UNAVAILABLE: 2,
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: ErrorCode | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        if retry_after is None and status in (429, 503):
            retry_after = 1 if code is None else RETRY_AFTER_S.get(code, 1)
        self.retry_after = retry_after

    @classmethod
    def of(
        cls, code: ErrorCode, message: str, *, param: str | None = None, retry_after: int | None = None
    ) -> APIError:
        """The error for ``code`` with its status from the shared table."""
        return cls(http_status(code), message, param=param, code=code, retry_after=retry_after)

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers())


def error_body(
    status: int, message: str, param: str | None = None, code: ErrorCode | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_status(code: str) -> int:
    """HTTP status for a worker's ErrorEvent code (the shared table; unknown codes: 500)."""
    return http_status(code)


def store_down(exc: BaseException) -> APIError:
    return APIError.of(
        ErrorCode.UNAVAILABLE, f"the job store (Redis) is unavailable: {type(exc).__name__}: {exc}"
    )


def from_validation(exc: ValidationError | RequestValidationError) -> APIError:
    """The first problem of a pydantic error as a 400 naming the offending parameter."""
    errors = exc.errors()
    if not errors:
        return APIError.of(ErrorCode.BAD_REQUEST, "invalid request")
    first = errors[0]
    loc = [
        p for p in first.get("loc", ()) if isinstance(p, str) and p not in ("body", "query", "path", "header")
    ]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value"))
    return APIError.of(ErrorCode.BAD_REQUEST, f"{param}: {msg}" if param else msg, param=param)


async def send_json(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    """A whole JSON response at the ASGI level (for middleware)."""
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": raw})


async def send_error(send: Send, err: APIError, headers: dict[str, str] | None = None) -> None:
    await send_json(send, err.status, err.body(), {**err.headers(), **(headers or {})})


class CatchAll:
    """Outermost middleware: an unexpected exception becomes a JSON 500 (or, for a Redis
    failure, a 503) when no response has started; the traceback goes to the log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if isinstance(exc, RedisError | OSError):
                err = store_down(exc)
                log.warning("request failed: %s", err.message)
            else:
                log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
                err = APIError.of(ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
            if not started:
                await send_error(send, err)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation(exc).response()

    @app.exception_handler(RedisError)
    async def _store_down(request: Request, exc: RedisError) -> JSONResponse:
        return store_down(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.BAD_REQUEST
        if exc.status_code >= 500:
            code = ErrorCode.INTERNAL
        err = APIError(exc.status_code, str(exc.detail), code=code)
        return JSONResponse(
            err.body(), status_code=exc.status_code, headers={**err.headers(), **(exc.headers or {})}
        )
