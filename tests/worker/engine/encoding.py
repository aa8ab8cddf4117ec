"""A text as the token ids the real-model tests feed: SmolLM2 through its chat template,
the others as plain text."""

from __future__ import annotations

from typing import Any


def encode(tokenizer: Any, name: str, text: str) -> list[int]:
    if name.startswith("smollm2"):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text)["input_ids"]]
