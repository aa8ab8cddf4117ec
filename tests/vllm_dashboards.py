"""vLLM's Grafana dashboards as Nightjar must serve them: the manifest of what they query
(deploy/grafana/vllm-queries.json) and a reader of a dashboard's PromQL (every panel's
targets and the templating variables' queries), so a dashboard file fetched beside the
manifest is checked against it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

GRAFANA = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
VLLM_DIR = GRAFANA / "vllm"  # where vLLM's dashboard files go when fetched (Grafana loads them)
MANIFEST = GRAFANA / "vllm-queries.json"
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*(.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


def manifest() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(MANIFEST.read_text())
    return data


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets (rows' panels too) and the
    query variables' definitions."""
    out: list[str] = []

    def panels(items: list[dict[str, Any]]) -> None:
        for p in items:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            panels(p.get("panels", []))

    panels(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            out.append(q["query"] if isinstance(q, dict) else str(q or var.get("definition", "")))
    return out


def used(exprs: list[str]) -> dict[str, set[str]]:
    """Metric name -> the labels the expressions select on it, or group by in the same
    expression, or a label_values() variable reads from it."""
    out: dict[str, set[str]] = {}
    for expr in exprs:
        target = expr
        m = _LABEL_VALUES.match(expr.strip())
        if m:
            target = m.group(1)
        grouped = {g.strip() for gs in _GROUPING.findall(target) for g in gs.split(",") if g.strip()}
        for name, matchers in _SELECTOR.findall(target):
            if name.startswith("__") or name in {"by", "on", "ignoring", "without"}:
                continue
            labels = {x for x in _MATCHER.findall(matchers) if x != "__name__"} | grouped
            if m:
                labels.add(m.group(2))
            out.setdefault(name, set()).update(labels)
    return out
