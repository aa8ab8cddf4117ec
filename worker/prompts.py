"""The model's tokenizer on the worker side: jobs in, prompt token ids out.

A chat job's ``tools`` go to the chat template (transformers' ``tools=``). A template that
does not read them gets them as a Hermes-style system message instead (``TOOLS_PREAMBLE``),
with earlier calls written as ``<tool_call>`` blocks, so any model sees what it may call and
the format its calls are parsed in (gateway/tools.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from shared.grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from shared.schemas import ChatMessage, JobRequest

log = logging.getLogger(__name__)

# Used only when the model ships no chat template of its own.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TOOLS_PREAMBLE = (
    "You may call one or more functions to assist with the user query. The functions:\n"
    "<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments within "
    f"{TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} tags:\n"
    f'{TOOL_CALL_OPEN}\n{{{{"name": <function-name>, "arguments": <args-json-object>}}}}\n{TOOL_CALL_CLOSE}'
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
        """The tokenizer of a model directory (or of a GGUF file's): its tokenizer files, else
        the one stored in its GGUF file. (transformers given both mixes them up and loses the
        chat template, so never both.)"""
        path = Path(model_dir)
        gguf = path.name if path.suffix == ".gguf" and path.is_file() else None
        if gguf is not None:
            path = path.parent
        if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
            gguf = gguf or next((p.name for p in sorted(path.glob("*.gguf"))), None)
            if gguf is not None:
                return cls(AutoTokenizer.from_pretrained(str(path), gguf_file=gguf))
        return cls(AutoTokenizer.from_pretrained(str(path)))

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
                self._messages(job), tools=self._tools(job), tokenize=False, add_generation_prompt=True
            )
            # The template writes the special tokens (BOS) itself.
            ids = list(self.tokenizer(str(text), add_special_tokens=False)["input_ids"])
        if not ids:
            raise PromptError("the prompt is empty")
        return ids

    @property
    def template_takes_tools(self) -> bool:
        return "tools" in str(self.tokenizer.chat_template)

    def _tools(self, job: JobRequest) -> list[dict[Any, Any] | Callable[..., Any]] | None:
        if not job.tools or not self.template_takes_tools:
            return None
        return [t.model_dump(exclude_none=True) for t in job.tools]

    def _messages(self, job: JobRequest) -> list[dict[str, Any]]:
        assert job.messages is not None
        native = self.template_takes_tools
        out = [_template_message(m, native) for m in job.messages]
        if job.tools and not native:
            listed = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in job.tools)
            preamble = TOOLS_PREAMBLE.format(tools=listed)
            if out and out[0]["role"] == "system":  # one system message: templates may want no second
                out[0]["content"] = f"{out[0]['content']}\n\n{preamble}"
            else:
                out.insert(0, {"role": "system", "content": preamble})
        return out


def _template_message(m: ChatMessage, native: bool) -> dict[str, Any]:
    """A message for the template: a call's arguments as an object (what templates expect),
    or, for a template without tools, the calls written into the content."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        calls = [
            {"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in m.tool_calls
        ]
        if native:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": f}
                for c, f in zip(m.tool_calls, calls, strict=True)
            ]
        else:
            blocks = (f"{TOOL_CALL_OPEN}\n{json.dumps(f)}\n{TOOL_CALL_CLOSE}" for f in calls)
            out["content"] = "\n".join([m.content, *blocks] if m.content else blocks)
    if m.tool_call_id is not None and native:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
