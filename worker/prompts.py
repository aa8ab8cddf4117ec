"""The model's tokenizer on the worker side: jobs in, prompt token ids out."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from shared.schemas import JobRequest

log = logging.getLogger(__name__)

# Used only when the model ships no chat template of its own.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class PromptError(ValueError):
    """The job's input cannot be turned into a prompt for this model."""


class PromptEncoder:
    """Tokenizes prompts and applies the model's chat template to chat messages."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        if tokenizer.chat_template is None:
            log.warning("the model has no chat template; chat jobs use a plain role/content one")
            tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> PromptEncoder:
        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def encode(self, job: JobRequest) -> list[int]:
        if job.prompt_token_ids is not None:
            bad = [t for t in job.prompt_token_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise PromptError(f"token ids out of the vocabulary (size {self.vocab_size}): {bad[:5]}")
            return list(job.prompt_token_ids)
        if job.prompt is not None:
            ids = list(self.tokenizer(job.prompt)["input_ids"])
        else:
            assert job.messages is not None  # JobRequest guarantees exactly one input
            text = self.tokenizer.apply_chat_template(
                [m.model_dump() for m in job.messages], tokenize=False, add_generation_prompt=True
            )
            # The template writes the special tokens (BOS) itself.
            ids = list(self.tokenizer(str(text), add_special_tokens=False)["input_ids"])
        if not ids:
            raise PromptError("the prompt is empty")
        return ids
