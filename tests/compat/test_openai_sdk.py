"""The official ``openai`` SDK, unchanged, against the real gateway (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compat.serving import sdk, served
from tests.e2e.conftest import poll
from tests.tiny_models import reference_greedy

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.anyio


async def _check(client: openai.AsyncOpenAI, model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    name = model_dir.name
    models = await client.models.list()
    assert [m.id for m in models.data] == [name]
    card = await client.models.retrieve(name)
    max_len = int(card.model_extra["max_model_len"])  # type: ignore[index]
    assert max_len > 0

    # Completions: greedy text equals the target's own, the SDK's typed objects parse.
    prompt = "Once upon a time"
    expected = tok.decode(reference_greedy(model_dir, tok(prompt)["input_ids"], 8), skip_special_tokens=True)
    done = await client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
    assert done.choices[0].text == expected and done.usage is not None and done.usage.completion_tokens == 8

    # Streaming with usage; unknown fields (extra_body) are ignored.
    stream = await client.completions.create(
        model=name,
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"some_future_field": 1, "top_k": -1},
    )
    text, usage = "", None
    async for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
        usage = chunk.usage or usage
    assert text == expected and usage is not None and usage.total_tokens == usage.prompt_tokens + 8

    # n and a list of prompts: choices in order.
    many = await client.completions.create(
        model=name, prompt=[prompt, "Redis"], n=2, max_tokens=4, temperature=0
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == expected[: len(many.choices[0].text)]

    # Chat, plain and streamed.
    msgs = [{"role": "user", "content": "hi"}]
    chat = await client.chat.completions.create(model=name, messages=msgs, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert chat.choices[0].message.role == "assistant" and chat.usage and chat.usage.completion_tokens == 4
    chunks = await client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=4,
        temperature=0,
        stream=True,
        n=2,  # type: ignore[arg-type]
    )
    per_choice: dict[int, str] = {}
    async for chunk in chunks:
        for c in chunk.choices:
            per_choice[c.index] = per_choice.get(c.index, "") + (c.delta.content or "")
    assert per_choice[0] == per_choice[1] == chat.choices[0].message.content

    # Typed errors: an unknown model is a NotFoundError, too long a request a BadRequestError.
    with pytest.raises(openai.NotFoundError) as nf:
        await client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert nf.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.completions.create(model=name, prompt="x", max_tokens=max_len + 1)
    assert bad.value.code == "context_length_exceeded" and "maximum context length" in str(bad.value)
    await _batch(client, name, expected)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(model=name, prompt="x", max_tokens=1, best_of=2)
    assert refused.value.param == "best_of"


async def _batch(client: openai.AsyncOpenAI, name: str, expected: str) -> None:
    """client.files.create + client.batches.create, unchanged, end to end."""
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": name, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0},
        }
        for i in range(3)
    ]
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    up = await client.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=up.id, endpoint="/v1/completions", completion_window="24h"
    )

    async def finished() -> object:
        got = await client.batches.retrieve(batch.id)
        return got if got.status in ("completed", "failed", "cancelled") else None

    done = await poll(finished, 60, "the batch to finish")
    assert done.status == "completed" and done.request_counts.completed == 3  # type: ignore[attr-defined]
    assert done.output_file_id and not done.error_file_id  # type: ignore[attr-defined]
    out = (await client.files.content(done.output_file_id)).text  # type: ignore[attr-defined]
    rows = [json.loads(x) for x in out.splitlines()]
    assert sorted(r["custom_id"] for r in rows) == ["r0", "r1", "r2"]
    assert all(r["response"]["body"]["choices"][0]["text"] == expected for r in rows)
    assert [b.id async for b in client.batches.list()] == [batch.id]


async def test_the_openai_sdk_against_the_gateway(model_dir: Path) -> None:
    async with served(model_dir) as base:
        client = sdk(base)
        try:
            await _check(client, model_dir)
        finally:
            await client.close()
