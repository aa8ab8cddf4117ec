"""Logging for every service: request ids, and a plain or a JSON (one object a line) format.

The gateway sets ``REQUEST_ID`` for the duration of each HTTP request (``X-Request-Id``,
accepted or generated), so every line logged while serving it carries the id; the job
carries it to the worker (``JobRequest.request_id``), whose lines about the job pass it
explicitly (``extra={"request_id": ...}``). Both formats show it: the plain one appends
``[request_id]`` when the message does not already name it; the JSON one has a
``request_id`` field, and every other ``extra`` field (``job_id``, ``worker``, …) too.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["plain", "json"]
FORMATS: tuple[LogFormat, ...] = ("plain", "json")
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

REQUEST_ID: ContextVar[str | None] = ContextVar("nightjar_request_id", default=None)
REQUEST_ID_HEADER = "X-Request-Id"
_VALID_ID = re.compile(r"^[!-~]{1,128}$")  # printable ASCII, no spaces: safe in headers and logs

# Attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def new_request_id() -> str:
    return secrets.token_hex(12)


def accept_request_id(given: str | None) -> str:
    """The client's id when it is a usable one (printable ASCII, ≤ 128), else a new id."""
    return given if given is not None and _VALID_ID.match(given) else new_request_id()


def _request_id(record: logging.LogRecord) -> str | None:
    rid = getattr(record, "request_id", None)
    return str(rid) if rid is not None else REQUEST_ID.get()


class PlainFormatter(logging.Formatter):
    def __init__(self, fmt: str = PLAIN_FORMAT) -> None:
        super().__init__(fmt)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = _request_id(record)
        if rid and rid not in record.getMessage():
            first, nl, rest = line.partition("\n")  # before a traceback
            line = f"{first} [{rid}]{nl}{rest}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, msg, request_id, the extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = _request_id(record)
        if rid:
            out["request_id"] = rid
        for k, v in record.__dict__.items():
            if k not in _STANDARD and k not in out and not k.startswith("_") and k != "color_message":
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else PlainFormatter()


def configure(level: str = "info", fmt: LogFormat = "plain") -> None:
    """Set up the root logger (stderr) in ``fmt``; uvicorn's loggers follow it."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    _uvicorn_follows(fmt)


def _uvicorn_follows(fmt: LogFormat) -> None:
    """uvicorn applies its own logging config when a server is made: point its formatters at
    ours (its default config is a module-level dict, read at that moment)."""
    try:
        from uvicorn.config import LOGGING_CONFIG
    except ImportError:  # pragma: no cover - the gateway's dependency
        return
    cls = "shared.logs.JsonFormatter" if fmt == "json" else "shared.logs.PlainFormatter"
    for name in ("default", "access"):
        LOGGING_CONFIG["formatters"][name] = {"()": cls}
