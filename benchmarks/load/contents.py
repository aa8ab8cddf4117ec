"""Content sources for phases whose content changes: chat, code, stories, Spec-Bench categories.

A phase names its content (``chat``, ``code``, ``chat+code``); each name is one source of
prompts read from the shared data directory (``../shared/data``, see its SOURCES.md) or the
standard library, always text the bundled models and drafters were not trained on:

- ``chat`` / ``sharegpt``: first human turns of ShareGPT (the 1,000-prompt file; SmolLM2's chat
  drafter saw the 500-prompt one), sent to the chat endpoint;
- ``alpaca``: the held-out Alpaca records (index 4500 on, as training/smol_data.py splits them);
- ``specbench`` (all 480) or one Spec-Bench category by name (``translation``, ``summarization``,
  ``qa``, ``math_reasoning``, ``rag``, ``writing``, ``roleplay``, ``reasoning``, ``math``,
  ``coding``, ``extraction``, ``stem``, ``humanities``), chat endpoint;
- ``code``: prefixes of the held-out standard-library files (training.corpus.code_domain's
  validation split), each ending on a ``def`` line, sent raw to the completions endpoint;
- ``stories``: the opening words of held-out TinyStories (the validation head), completions;
- ``shakespeare``: speeches from the held-out last tenth of tinyshakespeare, completions.

Raw-text sources go to ``/v1/completions`` whatever ``--endpoint`` says, because the drafters
that suit them were trained on raw text; chat sources go where ``--endpoint`` says.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.load.workloads import WorkloadError, WorkloadItem, load_workload, parse_rows

SPEC_BENCH = Path("workloads/spec_bench_question.jsonl")
SHAREGPT = Path("workloads/sharegpt_v3_filtered_1000.json")
ALPACA = Path("workloads/alpaca_5000.json")
ALPACA_HELD_OUT = 4500  # training/smol_data.py trains SmolLM2's chat drafter on the records before
STORIES_VAL = Path("corpus/tinystories_val_head.txt")
SHAKESPEARE = Path("corpus/tinyshakespeare.txt")
SPEC_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag", "writing", "roleplay",
                   "reasoning", "math", "coding", "extraction", "stem", "humanities")  # fmt: skip
RAW = "completions"
MAX_ITEMS = 2000  # per source: plenty for any phase plan (plans cycle through their prompts)
_DEF = re.compile(r"^\s*(async\s+)?def\s|^\s*class\s")


def _items(path: Path, tag: str, endpoint: str | None = None) -> list[WorkloadItem]:
    items = load_workload(path).items
    return [replace(it, category=tag, endpoint=endpoint) for it in items]


def _sharegpt(data: Path) -> list[WorkloadItem]:
    return _items(data / SHAREGPT, "chat")


def _alpaca(data: Path) -> list[WorkloadItem]:
    rows: Any = json.loads((data / ALPACA).read_text(encoding="utf-8"))
    if not isinstance(rows, list):
        raise WorkloadError(f"{data / ALPACA}: expected a JSON list")
    held = parse_rows(rows[ALPACA_HELD_OUT:], str(data / ALPACA)).items
    return [replace(it, category="alpaca") for it in held]


def _spec_bench(data: Path, category: str | None) -> list[WorkloadItem]:
    items = load_workload(data / SPEC_BENCH).items
    chosen = [it for it in items if category is None or it.category == category]
    return [replace(it, category=category or "specbench") for it in chosen]


def code_prefix(text: str, max_lines: int = 14) -> list[str]:
    """Up to 12 prompts from one source file: the lines before a ``def``/``class`` line and
    that line itself, at most ``max_lines`` of them (a model continues with its body)."""
    lines = text.splitlines()
    out: list[str] = []
    last = -25
    for i, line in enumerate(lines):
        if i >= 4 and _DEF.match(line) and i - last >= 25:
            out.append("\n".join(lines[max(0, i - max_lines + 1) : i + 1]) + "\n")
            last = i
        if len(out) == 12:
            break
    return out


def _code(_: Path) -> list[WorkloadItem]:
    from training.corpus import code_domain  # the same held-out split the drafters were kept from

    docs = code_domain(train_bytes=1).val
    prompts = [p for doc in docs for p in code_prefix(doc)]
    return [WorkloadItem(f"code-{i}", "code", p, endpoint=RAW) for i, p in enumerate(prompts)]


def _stories(data: Path, words: int = 24) -> list[WorkloadItem]:
    text = (data / STORIES_VAL).read_text(encoding="utf-8")
    stories = [s.strip() for s in text.split("\n\n") if len(s.split()) > 2 * words]
    return [WorkloadItem(f"story-{i}", "stories", " ".join(s.split()[:words]), endpoint=RAW)
            for i, s in enumerate(stories)]  # fmt: skip


def _shakespeare(data: Path) -> list[WorkloadItem]:
    play = (data / SHAKESPEARE).read_text(encoding="utf-8")
    held = play[play.index("\n\n", int(len(play) * 0.9)) :]  # training/corpus.py's held-out tenth
    speeches = [s.strip() for s in held.split("\n\n") if s.count("\n") >= 2]
    return [WorkloadItem(f"play-{i}", "shakespeare", s + "\n\n", endpoint=RAW)
            for i, s in enumerate(speeches)]  # fmt: skip


Reader = Callable[[Path], list[WorkloadItem]]


def _category(name: str) -> Reader:
    return lambda data: _spec_bench(data, name)


SOURCES: dict[str, Reader] = {
    "chat": _sharegpt,
    "sharegpt": _sharegpt,
    "alpaca": _alpaca,
    "specbench": lambda d: _spec_bench(d, None),
    "code": _code,
    "stories": _stories,
    "shakespeare": _shakespeare,
    **{c: _category(c) for c in SPEC_CATEGORIES},
}


class ContentLibrary:
    """Reads each content source once, on first use, from ``data_dir``."""

    def __init__(self, data_dir: str | Path, seed: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.seed = seed
        self._cache: dict[str, list[WorkloadItem]] = {}

    def get(self, name: str) -> list[WorkloadItem]:
        """The source's prompts in a seeded order; WorkloadError for an unknown or empty one."""
        if name not in self._cache:
            reader = SOURCES.get(name)
            if reader is None:
                raise WorkloadError(f"unknown content {name!r} (known: {', '.join(sorted(SOURCES))})")
            try:
                items = reader(self.data_dir)
            except (OSError, ValueError) as exc:
                raise WorkloadError(f"content {name!r} from {self.data_dir}: {exc}") from None
            if not items:
                raise WorkloadError(f"content {name!r}: no prompts in {self.data_dir}")
            random.Random(f"{self.seed}/{name}").shuffle(items)
            self._cache[name] = items[:MAX_ITEMS]
        return self._cache[name]

    def check(self, names: list[str]) -> None:
        for n in names:
            self.get(n)
