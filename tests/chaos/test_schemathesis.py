"""(g) A bounded schemathesis run against the gateway's /openapi.json: no 5xx, JSON bodies.

Schemathesis generates valid and invalid requests for every operation of the schema
(positive and negative modes), ``MAX_EXAMPLES`` per operation. Generated completions that
would ask for thousands of tokens are capped at ``TOKEN_CAP`` before they are sent, so the
run stays bounded; out-of-range values (the hostile ones) are sent as generated.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import anyio
import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from shared.connection import connect
from tests.chaos.cluster import Cluster

schemathesis = pytest.importorskip("schemathesis")
from schemathesis import GenerationMode  # noqa: E402

pytestmark = [pytest.mark.chaos, pytest.mark.redis]

MAX_EXAMPLES = 40
TOKEN_CAP = 4
REQUEST_TIMEOUT_S = 30.0


async def _heal(cluster: Cluster) -> None:
    r = connect(cluster.redis.url())
    try:
        await cluster.heal(r)
    finally:
        await r.aclose()


def _cap(body: Any) -> None:
    """Cap generated token budgets in range (TOKEN_CAP < n < 100,000) so valid jobs stay short."""
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and TOKEN_CAP < v < 100_000:
            body[key] = TOKEN_CAP
    _cap(body.get("params"))


def _problem(case: Any, cluster: Cluster, seen: Counter[str]) -> str | None:
    _cap(case.body)
    headers = {"Authorization": f"Bearer {cluster.admin_token}"} if case.path.startswith("/admin") else None
    try:
        resp = case.call(base_url=cluster.url, headers=headers, timeout=REQUEST_TIMEOUT_S)
    except requests.RequestException as exc:
        seen["no answer"] += 1
        return f"{case.method} {case.path}: {type(exc).__name__}: {exc}"
    seen[f"{resp.status_code // 100}xx"] += 1
    what = f"{case.method} {case.path} {str(case.body)[:120]!r} -> {resp.status_code}"
    if resp.status_code >= 500:
        return f"{what}: {resp.text[:300]}"
    ctype = resp.headers.get("content-type") or ""
    ctype = ctype[0] if isinstance(ctype, list) else ctype  # schemathesis keeps every value of a header
    if ctype.startswith("text/event-stream") or 300 <= resp.status_code < 400:
        return None
    try:
        json.loads(resp.content)
    except ValueError:
        return f"{what} not JSON ({ctype}): {resp.text[:200]!r}"
    return None


def test_openapi_schemathesis_no_5xx(cluster: Cluster) -> None:
    anyio.run(_heal, cluster)
    schema = schemathesis.openapi.from_url(f"{cluster.url}/openapi.json")
    seen: Counter[str] = Counter()
    problems: list[str] = []
    started = time.monotonic()
    ops = [result.ok() for result in schema.get_all_operations()]
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.generate],  # no shrinking: every problem is recorded as found
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                if (p := _problem(case, cluster, seen)) is not None:
                    problems.append(p)

            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (an operation without parameters)
                continue
    took = time.monotonic() - started
    print(
        f"\n[chaos g] schemathesis: {len(ops)} operations, {sum(seen.values())} requests in {took:.0f}s, "
        f"{dict(sorted(seen.items()))}, problems={len(problems)}"
    )
    for p in problems[:30]:
        print("  " + p)
    assert not cluster.dead(), cluster.logs_of_dead()
    assert not problems, problems[:10]
