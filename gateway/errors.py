"""Errors as JSON: OpenAI's shape {"error": {"message", "type", "param", "code"}} everywhere."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_status(code: str) -> int:
    """HTTP status for a worker's ErrorEvent code: the request's fault or the server's."""
    return 400 if code == "bad_request" else 500


def from_validation(exc: ValidationError | RequestValidationError) -> APIError:
    """The first problem of a pydantic error as a 400 naming the offending parameter."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    loc = [
        p for p in first.get("loc", ()) if isinstance(p, str) and p not in ("body", "query", "path", "header")
    ]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = from_validation(exc)
        return JSONResponse(error_body(400, err.message, err.param), status_code=400)

    @app.exception_handler(RedisError)
    async def _store_down(request: Request, exc: RedisError) -> JSONResponse:
        body = error_body(503, f"the job store (Redis) is unavailable: {type(exc).__name__}: {exc}")
        return JSONResponse(body, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)
