from __future__ import annotations

import pytest

from shared.schemas import ChatMessage, JobRequest
from shared.structured import FunctionCall, Tool, ToolCall
from tests.tiny_models import build_tokenizer
from worker.prompts import FALLBACK_CHAT_TEMPLATE, TOOLS_PREAMBLE, PromptEncoder, PromptError


def test_prompt_token_ids_and_chat() -> None:
    enc = PromptEncoder(build_tokenizer())
    tok = enc.tokenizer
    assert enc.encode(JobRequest(job_id="j", prompt="Hello")) == tok("Hello")["input_ids"]
    assert enc.encode(JobRequest(job_id="j", prompt_token_ids=[3, 4])) == [3, 4]
    with pytest.raises(PromptError, match="out of the vocabulary"):
        enc.encode(JobRequest(job_id="j", prompt_token_ids=[len(tok)]))
    chat = JobRequest(job_id="j", messages=[ChatMessage(role="user", content="hi")])
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert enc.encode(chat) == tok(text, add_special_tokens=False)["input_ids"]
    assert enc.encode(chat)[0] == tok.bos_token_id  # the template wrote BOS, once


def test_model_without_template_gets_the_fallback() -> None:
    tok = build_tokenizer()
    tok.chat_template = None
    enc = PromptEncoder(tok)
    assert tok.chat_template == FALLBACK_CHAT_TEMPLATE
    ids = enc.encode(JobRequest(job_id="j", messages=[ChatMessage(role="user", content="hi")]))
    assert tok.decode(ids) == "<|user|>\nhi\n<|assistant|>\n"


TOOL = Tool.model_validate(
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
)
HISTORY = [
    ChatMessage(role="user", content="hi"),
    ChatMessage(
        role="assistant",
        tool_calls=[ToolCall(id="c1", function=FunctionCall(name="weather", arguments='{"city": "Rome"}'))],
    ),
    ChatMessage(role="tool", tool_call_id="c1", content="sunny"),
]


def test_tools_reach_a_template_that_reads_them() -> None:
    tok = build_tokenizer()
    tok.chat_template = (
        "{% for t in tools or [] %}[{{ t['function']['name'] }}]{% endfor %}"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% for c in m['tool_calls'] or [] %}{{ c['function']['arguments']['city'] }}{% endfor %}"
        "{{ m['tool_call_id'] or '' }}{% endfor %}"
    )
    ids = PromptEncoder(tok).encode(JobRequest(job_id="j", messages=HISTORY, tools=[TOOL]))
    # The tools, and the call's arguments as an object (what templates index into).
    assert tok.decode(ids) == "[weather]<user>hi<assistant>Rome<tool>sunnyc1"


def test_a_template_without_tools_gets_them_as_a_system_message() -> None:
    tok = build_tokenizer()
    tok.chat_template = FALLBACK_CHAT_TEMPLATE
    text = str(tok.decode(PromptEncoder(tok).encode(JobRequest(job_id="j", messages=HISTORY, tools=[TOOL]))))
    assert text.startswith("<|system|>\n" + TOOLS_PREAMBLE.split("{tools}")[0])
    assert (
        '"name": "weather"' in text
        and '<tool_call>\n{"name": "weather", "arguments": {"city": "Rome"}}' in text
    )
    assert "<|tool|>\nsunny" in text
