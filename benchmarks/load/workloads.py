"""Workload readers: Spec-Bench, ShareGPT, Alpaca and plain prompt files, by content.

A file is a JSON list or JSON lines; each row is recognised by its keys:

- Spec-Bench ``{question_id, category, turns: [str, ...]}``: the first turn is the prompt;
- ShareGPT ``{id, conversations: [{from, value}, ...]}``: the first human turn is the prompt,
  the reply after it (when the file has one) is the reference output;
- Alpaca ``{instruction, input, output}`` (and Self-Instruct seed tasks, whose input and
  output sit in ``instances[0]``): instruction plus input, output as reference;
- ``{prompt, ...}``: the prompt as is, with an optional ``output``/``completion`` reference
  and an optional ``max_tokens``.

Rows that give no usable prompt are skipped and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class WorkloadError(ValueError):
    """The file is not a workload this reader understands."""


@dataclass(frozen=True)
class WorkloadItem:
    id: str
    category: str
    prompt: str
    reference: str | None = None  # a reference answer: gives an output length when wanted
    max_tokens: int | None = None  # an output length the file asks for
    endpoint: str | None = None  # "chat" or "completions" for this item (None: the run's --endpoint)


@dataclass
class Workload:
    path: str
    format: str  # the formats seen, e.g. "spec-bench" or "sharegpt"
    items: list[WorkloadItem]
    skipped: int = 0


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v.strip() else None


def _spec_bench(row: dict[str, Any], i: int) -> WorkloadItem | None:
    turns = row.get("turns") or []
    first = _text(turns[0]) if isinstance(turns, list) and turns else None
    if first is None:
        return None
    return WorkloadItem(str(row.get("question_id", i)), str(row.get("category", "spec-bench")), first)


def _sharegpt(row: dict[str, Any], i: int) -> WorkloadItem | None:
    turns = [t for t in row.get("conversations") or [] if isinstance(t, dict)]
    for k, turn in enumerate(turns):
        if turn.get("from") in ("human", "user") and (prompt := _text(turn.get("value"))):
            nxt = turns[k + 1] if k + 1 < len(turns) else {}
            ref = _text(nxt.get("value")) if nxt.get("from") in ("gpt", "assistant", "chatgpt") else None
            return WorkloadItem(str(row.get("id", i)), "sharegpt", prompt, ref)
    return None


def _alpaca(row: dict[str, Any], i: int) -> WorkloadItem | None:
    instruction = _text(row.get("instruction"))
    if instruction is None:
        return None
    instances = row.get("instances")
    src = (
        instances[0] if isinstance(instances, list) and instances and isinstance(instances[0], dict) else row
    )
    extra = _text(src.get("input"))
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    category = str(row.get("name") or "alpaca")
    return WorkloadItem(str(row.get("id", i)), category, prompt, _text(src.get("output")))


def _prompt(row: dict[str, Any], i: int) -> WorkloadItem | None:
    prompt = _text(row.get("prompt"))
    if prompt is None:
        return None
    ref = _text(row.get("output")) or _text(row.get("completion"))
    mt = row.get("max_tokens")
    max_tokens = mt if isinstance(mt, int) and not isinstance(mt, bool) and mt > 0 else None
    return WorkloadItem(str(row.get("id", i)), str(row.get("category", "prompt")), prompt, ref, max_tokens)


_READERS = (("spec-bench", "turns", _spec_bench), ("sharegpt", "conversations", _sharegpt),
            ("prompt", "prompt", _prompt), ("alpaca", "instruction", _alpaca))  # fmt: skip


def parse_rows(rows: list[Any], path: str = "<rows>") -> Workload:
    """Items from already-decoded rows (a JSON list, or the lines of a JSONL file)."""
    items: list[WorkloadItem] = []
    formats: list[str] = []
    skipped = 0
    for i, row in enumerate(rows):
        item = None
        if isinstance(row, dict):
            for fmt, key, reader in _READERS:
                if key in row:
                    item = reader(row, i)
                    if item is not None and fmt not in formats:
                        formats.append(fmt)
                    break
        if item is None:
            skipped += 1
        else:
            items.append(item)
    if not items:
        raise WorkloadError(f"{path}: no prompts found ({skipped} rows not understood)")
    return Workload(path, "+".join(formats), items, skipped)


def load_workload(path: str | Path) -> Workload:
    """Read a workload file (JSON list or JSON lines) into prompts."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"cannot read workload {p}: {exc.strerror or exc}") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith("["):
            rows = json.loads(stripped)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{p}: not JSON or JSON lines: {exc}") from None
    if not isinstance(rows, list):
        raise WorkloadError(f"{p}: expected a JSON list or JSON lines")
    return parse_rows(rows, str(p))
