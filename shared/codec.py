"""One msgpack codec for every message, with a schema version.

Wire form: msgpack of ``{"v": SCHEMA_VERSION, "t": kind, "d": payload}``. Anything that is
not a well-formed envelope of a known kind and version raises :class:`CodecError`, so a
service loop can dead-letter or skip the entry and keep running.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgpack
from pydantic import ValidationError

from shared.control import Decision, PolicyCommand, Telemetry, WorkerInfo
from shared.schemas import CancelRequest, ErrorEvent, FinishEvent, JobRequest, Message, StartEvent, TokenEvent

SCHEMA_VERSION = 1
FIELD = b"m"  # the single field of every stream entry that carries a message

# Every message type the wire carries.
ALL_MESSAGES: tuple[type[Message], ...] = (
    JobRequest,
    StartEvent,
    TokenEvent,
    FinishEvent,
    ErrorEvent,
    CancelRequest,
    Telemetry,
    Decision,
    PolicyCommand,
    WorkerInfo,
)
_KINDS: dict[str, type[Message]] = {cls.kind: cls for cls in ALL_MESSAGES}

M = TypeVar("M", bound=Message)


class CodecError(ValueError):
    """A message could not be decoded: malformed bytes, unknown kind or version, bad fields."""


def encode(msg: Message) -> bytes:
    if msg.kind not in _KINDS:
        raise CodecError(f"unregistered message type {type(msg).__name__}")
    body: dict[str, Any] = {"v": SCHEMA_VERSION, "t": msg.kind, "d": msg.model_dump(mode="json")}
    return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes | bytearray | memoryview) -> Message:
    try:
        env = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"not msgpack: {exc}") from exc
    if not isinstance(env, dict) or set(env) != {"v", "t", "d"}:
        raise CodecError("not a message envelope")
    if env["v"] != SCHEMA_VERSION:
        raise CodecError(f"unsupported schema version {env['v']!r}")
    cls = _KINDS.get(env["t"]) if isinstance(env["t"], str) else None
    if cls is None:
        raise CodecError(f"unknown message kind {env['t']!r}")
    if not isinstance(env["d"], dict):
        raise CodecError("message payload is not a map")
    try:
        return cls.model_validate(env["d"])
    except ValidationError as exc:
        raise CodecError(f"invalid {env['t']}: {exc.errors(include_url=False)}") from exc


def decode_as(data: bytes | bytearray | memoryview, cls: type[M]) -> M:
    return _as(decode(data), cls)


def entry(msg: Message) -> dict[Any, Any]:
    """The field map to XADD for one message (typed loosely: redis-py's stubs want a
    wider key type than bytes, and dict is invariant)."""
    return {FIELD: encode(msg)}


def from_entry(fields: dict[Any, Any]) -> Message:
    """Decode the message of a stream entry read back with XREAD/XREADGROUP."""
    raw = fields.get(FIELD, fields.get(FIELD.decode()))
    if raw is None:
        raise CodecError("stream entry has no message field")
    if isinstance(raw, str):
        raw = raw.encode("latin-1")
    return decode(raw)


def from_entry_as(fields: dict[Any, Any], cls: type[M]) -> M:
    """``from_entry``, and a CodecError unless the message is a ``cls``."""
    return _as(from_entry(fields), cls)


def _as(msg: Message, cls: type[M]) -> M:
    if not isinstance(msg, cls):
        raise CodecError(f"expected {cls.kind}, got {msg.kind}")
    return msg
