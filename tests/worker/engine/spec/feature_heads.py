"""Random feature-drafter heads for any target checkpoint, saved the way `train-eagle` saves them."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from transformers import AutoModelForCausalLM

from training.eagle_head import EagleHead
from training.eagle_pipeline import head_config, load_head, save_head


def make_head(
    target: Path, out: Path, seed: int = 0, vocab: int = 200, noise: float = 0.3
) -> tuple[Path, EagleHead]:
    """A head with ``vocab`` random token ids of the target's vocabulary (all when larger),
    weights perturbed away from the near-identity start; returns its directory and the head as
    the engine reads it (bf16-rounded)."""
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    embed = cast(torch.Tensor, hf.get_input_embeddings().weight).detach()
    lm_head = cast(torch.Tensor, hf.get_output_embeddings().weight).detach()
    cfg = head_config(hf.config, min(vocab, embed.shape[0]))
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ids = torch.randperm(embed.shape[0], generator=g)[: cfg.draft_vocab].sort().values
    head = EagleHead(cfg, embed, ids, lm_head)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(noise * torch.randn(p.shape, generator=g))
    save_head(head, out, target.name, {})
    return out, load_head(out, embed, lm_head)


def target_features(target: Path, tokens: list[int]) -> torch.Tensor:
    """The target's post-norm last-layer features at every position (transformers)."""
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
    with torch.no_grad():
        return hf.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]


def trained_head(target: Path, out: Path, steps: int = 60, vocab: int = 10**9, seed: int = 0) -> Path:
    """A head trained for a few seconds on the target's own greedy continuations of random
    prompts: accepted often enough that verification both accepts and rejects."""
    import random

    from training.eagle import HeadRecipe, select_vocab, train_head
    from training.eagle_data import generate_features

    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    rng = random.Random(seed)
    v = int(hf.config.vocab_size)
    prompts = [[rng.randrange(3, v) for _ in range(rng.randrange(4, 24))] for _ in range(48)]
    seqs = generate_features(hf, prompts, 24, None, 0, batch_size=16)
    for s in seqs:
        s.prompt_len = 1  # learn the prompts too: the engine drafts after random prompts
    embed = cast(torch.Tensor, hf.get_input_embeddings().weight).detach()
    cfg = head_config(hf.config, min(vocab, v))
    head = EagleHead(
        cfg,
        embed,
        select_vocab(seqs, cfg.draft_vocab, v),
        cast(torch.Tensor, hf.get_output_embeddings().weight),
    )
    recipe = HeadRecipe(name=out.name, train_sets=(), steps=steps, batch_size=8, lr=3e-3, warmup=5)
    train_head(head, seqs, [], recipe, seed, progress=False)
    save_head(head.eval(), out, target.name, {})
    return out
