"""Text and prompts for SmolLM2's drafters: chat (Alpaca, ShareGPT) and code (stdlib Python).

Chat text is formatted with SmolLM2's own chat template, exactly as the serving engine formats a
chat request, so the drafters learn the template's tokens too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from training.batches import WindowSampler
from training.corpus import DataError

ALPACA = Path("workloads/alpaca_5000.json")
SHAREGPT = Path("workloads/sharegpt_v3_filtered_500.json")
ALPACA_TRAIN = 4500  # records before this index train; the rest are held out
MAX_PROMPT_TOKENS = 128


def _load_json(data_dir: Path, rel: Path) -> Any:
    path = data_dir / rel
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def alpaca_records(data_dir: Path) -> list[dict[str, str]]:
    records: list[dict[str, str]] = _load_json(data_dir, ALPACA)
    return records


def alpaca_user_text(record: dict[str, str]) -> str:
    extra = record.get("input", "").strip()
    return record["instruction"].strip() + (f"\n\n{extra}" if extra else "")


def sharegpt_prompts(data_dir: Path) -> list[str]:
    """First human turns of the ShareGPT sample, in file order."""
    rows = _load_json(data_dir, SHAREGPT)
    return [row["conversations"][0]["value"] for row in rows if row.get("conversations")]


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], open_turn: bool) -> str:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=open_turn, tokenize=False)
    assert isinstance(text, str)
    return text


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, user_texts: list[str], limit: int,
                    max_tokens: int = MAX_PROMPT_TOKENS) -> list[list[int]]:
    """Up to ``limit`` chat prompts (template applied, assistant turn opened) of at most max_tokens."""
    out: list[list[int]] = []
    for text in user_texts:
        rendered = _render(tokenizer, [{"role": "user", "content": text}], open_turn=True)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            out.append(ids)
        if len(out) == limit:
            break
    return out


def conversation_stream(tokenizer: PreTrainedTokenizerBase, records: list[dict[str, str]]) -> torch.Tensor:
    """Alpaca records as whole chat transcripts (user turn and reference answer), concatenated."""
    texts = [_render(tokenizer, [{"role": "user", "content": alpaca_user_text(r)},
                                 {"role": "assistant", "content": r["output"].strip()}], open_turn=False)
             for r in records]
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return torch.tensor([t for row in ids for t in row], dtype=torch.long)


def code_stream(tokenizer: PreTrainedTokenizerBase, docs: list[str]) -> torch.Tensor:
    """Source files joined by blank lines (SmolLM2's tokenizer has no document separator we need)."""
    ids = tokenizer(docs, add_special_tokens=False, verbose=False)["input_ids"]
    sep = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    return torch.tensor([t for row in ids for t in [*row, *sep]], dtype=torch.long)


def code_prompt_ids(stream: torch.Tensor, count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` code prefixes of ``length`` tokens at seeded random offsets of the stream."""
    windows = WindowSampler(stream, length - 1, seed).sample(count)
    return [row.tolist() for row in windows]
