"""lm-eval-harness's ``local-completions`` requests, as it sends them by default (token-id
prompts: it counts the context with its own tokenizer), through the official ``openai`` SDK
against the real gateway and an embedded worker: loglikelihood is ``echo`` + ``logprobs: 1``
+ ``max_tokens: 1`` on the context's and continuation's ids, one prompt or a batch of them;
it reads ``token_logprobs[ctxlen:-1]``. Each value equals a transformers forward over the
same ids; the echoed text is the prompt's tokens' texts. (lm-eval itself runs in
tests/compat/run_clients.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.compat.serving import served
from tests.worker.engine.tiny import hf_model

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.anyio
TOL = 1e-4  # float32: the engine's kernels against transformers'


def _continuation_logprob(hf: Any, ids: list[int], ctxlen: int) -> float:
    with torch.inference_mode():
        lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    return float(sum(lp[i - 1, ids[i]] for i in range(ctxlen, len(ids))))


async def test_lm_eval_loglikelihood_requests_with_token_id_prompts(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok, hf = AutoTokenizer.from_pretrained(model_dir), hf_model(model_dir)
    pairs = [("Once upon a time", " there was"), ("The cat", " sat on the mat")]
    encoded = []
    for context, continuation in pairs:
        ctx = tok(context, add_special_tokens=False)["input_ids"]
        encoded.append((ctx + tok(continuation, add_special_tokens=False)["input_ids"], len(ctx)))
    async with served(model_dir) as base:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        try:
            for batch in ([encoded[0]], encoded):  # one prompt, then a batch (lm-eval's batch_size > 1)
                done = await client.completions.create(
                    model=model_dir.name,
                    prompt=[ids for ids, _ in batch],
                    echo=True,
                    logprobs=1,
                    max_tokens=1,
                    temperature=0,
                    seed=1234,
                )
                assert len(done.choices) == len(batch)
                for choice, (ids, ctxlen) in zip(
                    sorted(done.choices, key=lambda c: c.index), batch, strict=True
                ):
                    lp = choice.logprobs
                    assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
                    assert choice.text.startswith("".join(lp.tokens[: len(ids)]))
                    got = sum(lp.token_logprobs[ctxlen:-1])
                    assert abs(got - _continuation_logprob(hf, ids, ctxlen)) < TOL * len(ids)
            # Streamed, the echo comes first, with the prompt's logprobs.
            ids, _ = encoded[1]
            stream = await client.completions.create(
                model=model_dir.name,
                prompt=ids,
                echo=True,
                logprobs=1,
                max_tokens=1,
                temperature=0,
                stream=True,
            )
            chunks = [c.choices[0] async for c in stream if c.choices]
            assert chunks[0].logprobs is not None and len(chunks[0].logprobs.tokens) == len(ids)
            assert chunks[0].text == "".join(chunks[0].logprobs.tokens)
            # Without logprobs there is no text to echo a token-id prompt with: a 400.
            with pytest.raises(openai.BadRequestError):
                await client.completions.create(model=model_dir.name, prompt=ids, echo=True, max_tokens=1)
        finally:
            await client.close()
