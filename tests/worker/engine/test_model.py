"""Our decoder against transformers' forward on the same checkpoints (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from tests.worker.engine.tiny import ARCHS, LLAMA3_ROPE, VOCAB, hf_model
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.rope import inverse_frequencies
from worker.engine.weights import load_checkpoint

BS = 4


def runner_for(path: Path, num_blocks: int = 64) -> ModelRunner:
    config, state = load_checkpoint(path)
    return ModelRunner(config, state, BS, torch.device("cpu"), torch.float32, num_blocks=num_blocks)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_and_mixed_batch_match_transformers(arch: str, tiny_models: dict[str, Path]) -> None:
    path = tiny_models[arch]
    hf = hf_model(path)
    runner = runner_for(path)
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(3, VOCAB, (45,), generator=gen).tolist()
    b = torch.randint(3, VOCAB, (9,), generator=gen).tolist()
    with torch.inference_mode():
        ref_a = hf(torch.tensor([a])).logits[0]
        ref_b = hf(torch.tensor([b])).logits[0]
    ta, tb = list(range(0, 12)), list(range(20, 23))
    # Step 1: a's first chunk (all its logits) alongside b's whole prompt except one token.
    logits, first = runner.run([ForwardItem(a[:30], 0, ta, 30), ForwardItem(b[:8], 0, tb, 8)])
    assert rel_err(logits[first[0] : first[0] + 30], ref_a[:30]) <= 1e-4
    assert rel_err(logits[first[1] : first[1] + 8], ref_b[:8]) <= 1e-4
    # Step 2: b's decode row batched with a's next chunk; then a's last row alone.
    logits, first = runner.run([ForwardItem(a[30:44], 30, ta, 14), ForwardItem(b[8:], 8, tb, 1)])
    assert rel_err(logits[first[0] : first[0] + 14], ref_a[30:44]) <= 1e-4
    assert rel_err(logits[first[1]], ref_b[8]) <= 1e-4
    logits, _ = runner.run([ForwardItem(a[44:], 44, ta, 1)])
    assert rel_err(logits[0], ref_a[44]) <= 1e-4


def test_verification_rows_and_rollback(llama_dir: Path) -> None:
    """γ+1 rows per sequence, logits for all of them; rejected rows are rolled back by
    simply recomputing from the accepted length (the stale slots are overwritten)."""
    hf = hf_model(llama_dir)
    runner = runner_for(llama_dir)
    seq = torch.randint(3, VOCAB, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    wrong = [(t + 1) % VOCAB for t in seq[14:18]]
    with torch.inference_mode():
        ref = hf(torch.tensor([seq])).logits[0]
    table = [5, 9, 2, 7, 30]
    runner.run([ForwardItem(seq[:13], 0, table, 1)])
    # Verify [last token, 4 drafts]; the first draft is right, the rest wrong.
    drafts = [seq[13], seq[14], *wrong[1:]]
    logits, _ = runner.run([ForwardItem(drafts, 13, table, 5)])
    assert rel_err(logits[:2], ref[13:15]) <= 1e-4
    # Accept 1 draft: positions 13, 14 stay; resume from position 15 with the true tokens.
    logits, _ = runner.run([ForwardItem(seq[15:20], 15, table, 5)])
    assert rel_err(logits, ref[15:20]) <= 1e-4


def test_rope_inverse_frequencies_match_transformers() -> None:
    for params in (
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        LLAMA3_ROPE,
    ):
        hf_config = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=dict(params))
        ours = ModelConfig.from_dict(hf_config.to_dict())
        ref = LlamaRotaryEmbedding(hf_config)
        inv, scale = inverse_frequencies(ours.rope)
        assert torch.equal(inv, ref.inv_freq) and scale == ref.attention_scaling


def test_transformers_4_rope_spelling_is_read() -> None:
    cfg = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_theta": 500000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    rope = ModelConfig.from_dict(cfg).rope
    assert rope["rope_type"] == "linear" and rope["rope_theta"] == 500000.0 and rope["factor"] == 2.0


def test_unsupported_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported model_type"):
        ModelConfig.from_dict({"model_type": "gpt2"})


def test_decode_rows_of_very_different_contexts(llama_dir: Path) -> None:
    """Decode rows are split into attention groups by context length; all must stay exact."""
    hf = hf_model(llama_dir)
    runner = runner_for(llama_dir, num_blocks=128)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (3, 9, 40, 41, 150, 7)]
    tables, first = [], 0
    for s in seqs:
        tables.append(list(range(first, first + len(s) // BS + 1)))
        first += len(s) // BS + 1
    runner.run([ForwardItem(s[:-1], 0, t, 0) for s, t in zip(seqs, tables, strict=True)])
    logits, _ = runner.run([ForwardItem(s[-1:], len(s) - 1, t, 1) for s, t in zip(seqs, tables, strict=True)])
    with torch.inference_mode():
        for i, s in enumerate(seqs):
            assert rel_err(logits[i], hf(torch.tensor([s])).logits[0, -1]) <= 1e-4


@pytest.mark.parametrize("rows", [2, 3])
def test_two_or_three_logits_rows_are_padded_and_come_out_right(llama_dir: Path, rows: int) -> None:
    hf = hf_model(llama_dir)
    runner = runner_for(llama_dir)
    tokens = torch.randint(3, VOCAB, (10,), generator=torch.Generator().manual_seed(4)).tolist()
    logits, _ = runner.run([ForwardItem(tokens, 0, [0, 1, 2], rows)])
    with torch.inference_mode():
        ref = hf(torch.tensor([tokens])).logits[0, -rows:]
    assert logits.shape == (rows, VOCAB) and rel_err(logits, ref) <= 1e-4
