"""Workload readers on small inline samples of each format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.load.workloads import WorkloadError, load_workload, parse_rows

SPEC_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now another."]},
    {"question_id": 82, "category": "math", "turns": ["What is 2+2?"]},
]
SHAREGPT = [
    {
        "id": "a1",
        "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}],
    },
    {
        "id": "a2",
        "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "Second?"}],
    },
    {"id": "a3", "conversations": []},
]
ALPACA = [
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
    {"instruction": "Name a colour.", "input": "", "output": "Blue"},
]
SEED_TASKS = [
    {"id": "seed_task_0", "name": "breakfast", "instruction": "Suggest a breakfast.",
     "instances": [{"input": "", "output": "Oatmeal."}], "is_classification": False},
]  # fmt: skip
PROMPTS = [{"prompt": "Once upon a time", "max_tokens": 12}, {"prompt": "Tell me", "completion": "a story"}]


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_spec_bench_jsonl_takes_the_first_turn(tmp_path: Path) -> None:
    w = load_workload(_jsonl(tmp_path / "q.jsonl", SPEC_BENCH))
    assert w.format == "spec-bench"
    assert [(i.id, i.category, i.prompt) for i in w.items] == [
        ("81", "writing", "Write a haiku."),
        ("82", "math", "What is 2+2?"),
    ]
    assert all(i.reference is None for i in w.items)


def test_sharegpt_json_takes_the_first_human_turn_and_its_reply(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    w = load_workload(path)
    assert w.format == "sharegpt"
    assert [(i.id, i.prompt, i.reference) for i in w.items] == [
        ("a1", "Hi there", "Hello!"),
        ("a2", "Second?", None),
    ]
    assert w.skipped == 1


def test_alpaca_joins_instruction_and_input(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps(ALPACA))
    w = load_workload(path)
    assert w.format == "alpaca"
    assert w.items[0].prompt == "Translate to French.\n\nGood morning"
    assert w.items[0].reference == "Bonjour"
    assert w.items[1].prompt == "Name a colour."


def test_self_instruct_seed_tasks_read_their_first_instance() -> None:
    w = parse_rows(SEED_TASKS)
    assert (w.items[0].id, w.items[0].category, w.items[0].reference) == (
        "seed_task_0",
        "breakfast",
        "Oatmeal.",
    )


def test_prompt_jsonl_keeps_lengths_and_references(tmp_path: Path) -> None:
    w = load_workload(_jsonl(tmp_path / "p.jsonl", PROMPTS))
    assert w.format == "prompt"
    assert (w.items[0].prompt, w.items[0].max_tokens) == ("Once upon a time", 12)
    assert (w.items[1].reference, w.items[1].max_tokens) == ("a story", None)


def test_unknown_or_broken_files_raise(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no prompts"):
        load_workload(_jsonl(tmp_path / "x.jsonl", [{"foo": 1}]))
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(WorkloadError, match="not JSON"):
        load_workload(bad)
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "missing.json")
