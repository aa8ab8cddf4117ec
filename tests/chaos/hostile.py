"""A corpus of hostile HTTP requests, built as raw bytes (so it can hold what ``json.dumps``
never writes: lone surrogates, NaN, integers past 64 bits, nesting deeper than a parser's
recursion limit, bytes that are not UTF-8).

Each valid body of the corpus asks for at most one token, so the requests that get through
are cheap for the workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

HOLE = "__HOSTILE__"

# Raw JSON text put where a value goes.
VALUES: dict[str, str] = {
    "2^64": str(2**64),
    "-2^64-1": str(-(2**64) - 1),
    "2^63": str(2**63),
    "400 digits": "1" + "0" * 400,
    "5000 digits": "9" * 5000,  # past Python's int-from-string limit
    "1e309": "1e309",
    "-1e309": "-1e309",
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "-1": "-1",
    "0": "0",
    "-0.0": "-0.0",
    "1.5": "1.5",
    "1e-300": "1e-300",
    "5e-324": "5e-324",
    "true": "true",
    "null": "null",
    "string": '"x"',
    "lone high surrogate": '"\\ud800"',
    "lone low surrogate": '"\\udfff"',
    "reversed pair": '"a\\udc00\\ud800b"',
    "NUL": '"\\u0000"',
    "empty string": '""',
    "empty list": "[]",
    "empty object": "{}",
    "list of huge ints": f"[{2**64}, -1, {2**70}]",
    "list of surrogates": '["\\ud800", "\\udfff"]',
    "deep list": "[" * 3000 + "]" * 3000,
    "deep object": '{"a":' * 3000 + "1" + "}" * 3000,
    "long string": '"' + "a" * 200_000 + '"',
}

_JOB = {"prompt": "hi", "params": {"max_tokens": 1}}
_COMPLETION = {"prompt": "hi", "max_tokens": 1, "temperature": 0}
_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
_ADMIN = {"policy": "static", "params": {"gamma": 1}}

# (route, template, paths to put each value at); a path is a tuple of keys / list indexes.
TARGETS: list[tuple[str, dict[str, Any], list[tuple[str | int, ...]]]] = [
    (
        "/v1/jobs",
        _JOB,
        [
            ("prompt",),
            ("prompt_token_ids",),
            ("messages",),
            ("params",),
            ("params", "max_tokens"),
            ("params", "temperature"),
            ("params", "top_p"),
            ("params", "top_k"),
            ("params", "seed"),
            ("params", "stop"),
            ("priority",),
            ("params", "bogus"),
            ("bogus",),
        ],
    ),
    (
        "/v1/completions",
        _COMPLETION,
        [
            ("prompt",),
            ("max_tokens",),
            ("temperature",),
            ("top_p",),
            ("n",),
            ("stream",),
            ("stop",),
            ("seed",),
            ("top_k",),
            ("priority",),
            ("model",),
            ("logprobs",),
            ("stream_options",),
            ("user",),
        ],
    ),
    (
        "/v1/chat/completions",
        _CHAT,
        [
            ("messages",),
            ("messages", 0),
            ("messages", 0, "content"),
            ("messages", 0, "role"),
            ("max_tokens",),
            ("max_completion_tokens",),
            ("temperature",),
            ("seed",),
            ("stop",),
            ("user",),
            ("model",),
        ],
    ),
    ("/admin/policy", _ADMIN, [("policy",), ("params",), ("params", "gamma"), ("params", "x")]),
]


@dataclass
class Req:
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _put(template: Any, path: tuple[str | int, ...]) -> Any:
    """A deep copy of ``template`` with ``HOLE`` at ``path``."""
    doc = json.loads(json.dumps(template))
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = HOLE
    return doc


def field_cases(admin_token: str) -> Iterator[Req]:
    for route, template, paths in TARGETS:
        headers = {"content-type": "application/json"}
        if route.startswith("/admin"):
            headers["authorization"] = f"Bearer {admin_token}"
        for path in paths:
            text = json.dumps(_put(template, path))
            for name, raw in VALUES.items():
                body = text.replace(json.dumps(HOLE), raw).encode()
                yield Req("POST", route, body, headers, f"{route} {'.'.join(map(str, path))} = {name}")


BAD_BODIES: dict[str, bytes] = {
    "empty": b"",
    "truncated": b'{"prompt": "x"',
    "trailing comma": b'{"prompt": "x",}',
    "not utf-8": b'{"prompt": "\xff\xfe"}',
    "utf-16": '{"prompt": "x"}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"prompt": "x"}',
    "null": b"null",
    "list": b"[]",
    "string": b'"prompt"',
    "number": b"123",
    "duplicate keys": b'{"prompt": "x", "prompt": 5}',
    "deep": b"[" * 100_000,
    "single quotes": b"{'prompt': 'x'}",
    "nul bytes": b"\x00" * 64,
}


def body_cases() -> Iterator[Req]:
    for route in ("/v1/jobs", "/v1/completions", "/v1/chat/completions"):
        for name, body in BAD_BODIES.items():
            yield Req("POST", route, body, {"content-type": "application/json"}, f"{route} body {name}")
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
            yield Req("POST", route, b'{"prompt": "x"}', {"content-type": ctype}, f"{route} as {ctype!r}")


ODD_IDS = [
    "abc:events",
    "x:cancel",
    "nj:jobs",
    "..",
    "%2e%2e%2f%2e%2e",
    "%00",
    "a" * 5000,
    "%F0%9F%92%A5",
    "%ED%A0%80",
    "*",
    "%20",
    "-1",
    "0-0",
    "job%0d%0aX-Injected:%201",
    "a:b:c:events",
]


def path_cases(job_id: str) -> Iterator[Req]:
    for odd in ODD_IDS:
        for suffix in ("", "/events"):
            yield Req("GET", f"/v1/jobs/{odd}{suffix}", note=f"GET id {odd[:20]}{suffix}")
        yield Req("DELETE", f"/v1/jobs/{odd}", note=f"DELETE id {odd[:20]}")
    for last in (
        "99999999999999999999999-0",
        "-1",
        "abc",
        "0-0" * 500,
        "$",
        "+",
        "1-",
        "18446744073709551616-0",
    ):
        for target in (job_id, "unknown0123"):
            yield Req(
                "GET",
                f"/v1/jobs/{target}/events",
                headers={"last-event-id": last},
                note=f"Last-Event-ID {last[:20]} on {target[:8]}",
            )
    for method, path in [
        ("GET", "/v2/models"),
        ("GET", "/v1/"),
        ("GET", "/v1/jobs/"),
        ("GET", "/admin/"),
        ("POST", "/v1/models"),
        ("GET", "/v1/completions"),
        ("PUT", "/v1/jobs"),
        ("PATCH", f"/v1/jobs/{job_id}"),
        ("GET", "/" + "x" * 4000),
        ("POST", f"/v1/jobs/{job_id}"),
        ("DELETE", "/v1/jobs"),
        ("GET", "/admin/policy"),
        ("TRACE", "/"),
        ("GET", "/%ff%fe"),
        ("GET", "/v1/jobs/%"),
        ("OPTIONS", "/v1/jobs"),
    ]:
        yield Req(method, path, note=f"{method} {path[:30]}")


def header_cases(job_id: str, admin_token: str) -> Iterator[Req]:
    job = json.dumps(_JOB).encode()
    for value in ("x" * 3000, "\u00ff\u00fe", "", "a b c", "k" * 257):
        yield Req(
            "POST",
            "/v1/jobs",
            job,
            {"content-type": "application/json", "idempotency-key": value},
            note=f"Idempotency-Key {value[:10]!r}",
        )
    for auth in (
        "Bearer",
        "Bearer  x",
        "Basic eA==",
        "Bearer " + "x" * 3000,
        "bearer \u00ff",
        admin_token + "x",
    ):
        yield Req(
            "POST",
            "/admin/policy",
            json.dumps(_ADMIN).encode(),
            {"content-type": "application/json", "authorization": auth},
            note=f"admin auth {auth[:12]!r}",
        )
        yield Req(
            "GET", f"/v1/jobs/{job_id}", headers={"authorization": auth}, note=f"job auth {auth[:12]!r}"
        )
    yield Req(
        "POST",
        "/v1/jobs",
        job,
        {"content-type": "application/json", "content-encoding": "gzip"},
        note="gzip lie",
    )


def corpus(job_id: str, admin_token: str) -> list[Req]:
    return [
        *field_cases(admin_token),
        *body_cases(),
        *path_cases(job_id),
        *header_cases(job_id, admin_token),
    ]
