"""Architectures of the bundled models and their training recipes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from transformers import LlamaConfig

from training.corpus import PROSE_DOMAINS


@dataclass(frozen=True)
class ArchSpec:
    """A Llama shape; ``vocab_size`` comes from the tokenizer at build time."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 2048
    rope_theta: float = 10000.0

    def llama_config(self, vocab_size: int, eos_id: int, bos_id: int | None = None,
                     pad_id: int | None = None) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=eos_id if bos_id is None else bos_id,
            eos_token_id=eos_id,
            pad_token_id=eos_id if pad_id is None else pad_id,
            dtype="bfloat16",  # what the files hold; the engine upcasts on CPU
        )

    def matmul_params(self, vocab_size: int) -> int:
        """Weights touched by one token's forward pass, counting the tied output layer once more.

        Twice this is the forward FLOPs per token (attention scores excluded), the measure
        behind the "drafter costs at most 1/8 of the target" rule.
        """
        head_dim = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp) + vocab_size * self.hidden


@dataclass(frozen=True)
class Recipe:
    """How one model is trained; steps are fixed so that a seed gives the same run."""

    name: str
    arch: ArchSpec
    domains: tuple[str, ...]
    steps: int
    batch_size: int
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 30
    distill: bool = False
    topk: int = 32  # teacher logits kept per position when distilling
    continuations: int = 0  # target greedy continuations added to a drafter's data
    max_windows: int | None = None  # cap on the text windows a drafter is distilled on

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


TARGET = Recipe(
    name="nj-target",
    arch=ArchSpec(hidden=256, layers=6, heads=8, kv_heads=4, intermediate=768),
    domains=("stories", "shakespeare", "code"),
    # Small batches: a few million tokens leave the model far from converged, and there more
    # updates of the same tokens learn faster than fewer, larger ones (measured: batch 8 reached a
    # lower loss than batch 16 after the same 410k tokens, 5.37 vs 5.90).
    steps=1600,
    batch_size=8,
    warmup=40,
)

_DRAFT_ARCH = ArchSpec(hidden=96, layers=2, heads=4, kv_heads=2, intermediate=288)

DRAFTERS = (
    Recipe(name="nj-draft-prose", arch=_DRAFT_ARCH, domains=PROSE_DOMAINS, steps=200,
           batch_size=32, lr=3e-3, distill=True, continuations=256, max_windows=1200),
    Recipe(name="nj-draft-code", arch=_DRAFT_ARCH, domains=("code",), steps=200,
           batch_size=32, lr=3e-3, distill=True, continuations=256, max_windows=1200),
)
