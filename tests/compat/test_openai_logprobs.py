"""Logprobs through the official ``openai`` SDK, unchanged, against the real gateway and an
embedded worker (the tiny model, the default planner policy: speculation on): completions
and chat, whole and streamed; echo with max_tokens 0 (lm-eval-harness's loglikelihood
request), twice, so the second one's prompt is in the prefix cache. Every value equals the
log-softmax of a plain transformers forward over the same tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.compat.serving import sdk, served
from tests.worker.engine.tiny import hf_model

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.anyio
TOL = 1e-4  # float32: the engine's kernels against transformers'


def _reference(hf: Any, ids: list[int]) -> torch.Tensor:
    """log_softmax of a plain forward: row p scores token p + 1."""
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def _close(got: list[float], want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got), want, atol=TOL)


async def _completions(client: Any, name: str, tok: Any, hf: Any) -> None:
    prompt = "Once upon a time"
    ids = tok(prompt)["input_ids"]
    done = await client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    for i, top in enumerate(lp.top_logprobs):
        assert 1 <= len(top) <= 4 and max(top.values()) == lp.token_logprobs[i]  # greedy: the top one
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    # Against transformers: the output's tokens follow from greedy decoding of the reference.
    full = ids[:]
    ref = []
    for _ in range(8):
        row = _reference(hf, full)[-1]
        full.append(int(row.argmax()))
        ref.append(row.max())
    assert _close(lp.token_logprobs, torch.stack(ref))

    stream = await client.completions.create(
        model=name, prompt=prompt, max_tokens=8, temperature=0, logprobs=3, stream=True
    )
    values: list[float] = []
    async for chunk in stream:
        for c in chunk.choices:
            values += c.logprobs.token_logprobs if c.logprobs else []
    assert _close(values, torch.tensor(lp.token_logprobs))

    # lm-eval-harness's loglikelihood: echo, logprobs, max_tokens 0; twice (the prompt is
    # cached the second time: prompt logprobs skip the prefix cache, so they are computed).
    want = _reference(hf, ids)[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    for _ in range(2):
        echo = await client.completions.create(
            model=name, prompt=prompt, echo=True, logprobs=1, max_tokens=0, temperature=0
        )
        (choice,) = echo.choices
        assert choice.text == prompt and echo.usage.completion_tokens == 0
        assert len(choice.logprobs.tokens) == len(ids) and choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.top_logprobs[0] is None
        assert _close(choice.logprobs.token_logprobs[1:], want)
    streamed = await client.completions.create(
        model=name, prompt=prompt, echo=True, logprobs=1, max_tokens=0, temperature=0, stream=True
    )
    texts: list[str] = []
    got: list[float | None] = []
    async for chunk in streamed:
        for c in chunk.choices:
            texts.append(c.text)
            got += c.logprobs.token_logprobs if c.logprobs else []
    assert "".join(texts) == prompt and got[0] is None
    assert _close([float(x) for x in got[1:] if x is not None], want)


async def _chat(client: Any, name: str, tok: Any, hf: Any) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    chat = await client.chat.completions.create(
        model=name, messages=msgs, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    full, ref = ids[:], []
    for item in content:
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob == item.logprob
        assert item.bytes == list(item.token.encode())
        row = _reference(hf, full)[-1]
        full.append(int(row.argmax()))
        ref.append(row.max())
    assert _close([c.logprob for c in content], torch.stack(ref))

    stream = await client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        n=2,
    )
    per_choice: dict[int, list[float]] = {}
    async for chunk in stream:
        for c in chunk.choices:
            per_choice.setdefault(c.index, []).extend(
                x.logprob for x in (c.logprobs.content if c.logprobs else [])
            )
    assert set(per_choice) == {0, 1}
    for values in per_choice.values():
        assert _close(values, torch.tensor([c.logprob for c in content]))


async def test_logprobs_through_the_openai_sdk(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok, hf = AutoTokenizer.from_pretrained(model_dir), hf_model(model_dir)
    async with served(model_dir) as base:
        client = sdk(base)
        try:
            await _completions(client, model_dir.name, tok, hf)
            await _chat(client, model_dir.name, tok, hf)
        finally:
            await client.close()
