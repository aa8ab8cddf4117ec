from __future__ import annotations

import pytest

from shared.schemas import ChatMessage, JobRequest
from tests.tiny_models import build_tokenizer
from worker.prompts import FALLBACK_CHAT_TEMPLATE, PromptEncoder, PromptError


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
