"""An EAGLE-style feature head in torch, for training: one Llama decoder layer over the target's features.

Entry ``i`` of a sequence reads ``fc([f_i; embed(x_{i+1})])`` — the target's post-norm last-layer
feature at position ``i`` and the embedding of the token that followed — runs one Llama
decoder layer (causal, rotary position ``i``) and a final RMSNorm, giving ``h_i``, the head's
guess of ``f_{i+1}``; the target's (tied) LM head restricted to the head's vocabulary turns it
into the distribution of ``x_{i+2}``. The target's embedding is referenced, never a parameter.

``chain`` runs the head the way a drafter does: a pass over real features, then ``steps`` more
passes in which every start ``i`` feeds its own previous output as the feature of the next
entry (attending to the real entries ``≤ i`` and to its own drafted entries): the s-th pass
predicts the (s+1)-th draft token after every start. Training on these passes is EAGLE-3's
"training-time test"; evaluation uses the same function, so the α it reports is the α of the
engine's chain drafting. Tokens fed to drafted entries are the target's own (only accepted
prefixes matter, and an accepted draft equals the target's token).

The arithmetic mirrors ``worker.engine.model`` (RMSNorm in fp32, rotate-half rotary, SiLU MLP),
so the exported weights run unchanged in the engine's ``FeatureModel``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    hidden: int = 576
    intermediate: int = 1536
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    rms_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_positions: int = 8192
    target_vocab: int = 49152
    draft_vocab: int = 8192

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


class EagleHead(nn.Module):
    vocab_ids: torch.Tensor  # buffers
    inv_freq: torch.Tensor

    def __init__(self, cfg: HeadConfig, embed: torch.Tensor, vocab_ids: torch.Tensor,
                 head: torch.Tensor | None = None) -> None:
        """``embed``: the target's input embedding; ``head``: its output layer (the embedding
        itself when tied, as SmolLM2's is)."""
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.head_dim
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.input_norm = nn.Parameter(torch.ones(h))
        self.q = nn.Linear(h, cfg.heads * d, bias=False)
        self.k = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.v = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.o = nn.Linear(cfg.heads * d, h, bias=False)
        self.post_norm = nn.Parameter(torch.ones(h))
        self.gate = nn.Linear(h, cfg.intermediate, bias=False)
        self.up = nn.Linear(h, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, h, bias=False)
        self.norm = nn.Parameter(torch.ones(h))
        with torch.no_grad():  # start as "the feature goes through": fc ≈ [I | small]
            self.fc.weight.mul_(0.1)
            self.fc.weight[:, :h] += torch.eye(h)
            self.o.weight.mul_(0.1)
            self.down.weight.mul_(0.1)
        self.register_buffer("vocab_ids", vocab_ids.long().clone(), persistent=True)
        self.embed = embed.detach()  # the target's table: referenced, not trained, not saved
        self.lm_head = (self.embed if head is None else head.detach())[self.vocab_ids].contiguous()
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv, persistent=False)

    # ------------------------------------------------------------------ pieces

    def inputs(self, feats: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([feats, F.embedding(next_tokens, self.embed)], dim=-1))

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, D], pos [T] (or [B, T])."""
        freqs = pos.unsqueeze(-1).float() * self.inv_freq
        cos, sin = freqs.cos(), freqs.sin()
        if cos.dim() == 2:
            cos, sin = cos[None, None], sin[None, None]
        else:
            cos, sin = cos[:, None], sin[:, None]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        c = self.cfg
        y = _rms(x, self.input_norm, c.rms_eps)
        q = self.q(y).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(y).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(y).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        g = c.heads // c.kv_heads
        k = self._rope(k, pos).repeat_interleave(g, dim=1)
        return self._rope(q, pos), k, v.repeat_interleave(g, dim=1)

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residuals, MLP and the final norm: the head's output feature ``h``."""
        b, _, t, _ = attn.shape
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        y = _rms(x, self.post_norm, self.cfg.rms_eps)
        x = x + self.down(F.silu(self.gate(y)) * self.up(y))
        return _rms(x, self.norm, self.cfg.rms_eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Over the head's vocabulary (index ``j`` is target token ``vocab_ids[j]``)."""
        return h @ self.lm_head.T

    # ------------------------------------------------------------------ chain

    def chain(self, feats: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Head outputs ``h`` of ``steps + 1`` passes, each ``[B, T, H]``.

        feats [B, T, H]: f_0..f_{T-1}; tokens [B, T + steps]: x_1 .. x_{T+steps} (row ``i`` of
        pass ``s`` fed token ``tokens[:, i + s]``). Pass ``s`` row ``i`` predicts x_{i+s+2}.
        """
        t = feats.shape[1]
        pos = torch.arange(t, device=feats.device)
        scale = self.cfg.head_dim ** -0.5
        x = self.inputs(feats, tokens[:, :t])
        q, k0, v0 = self._qkv(x, pos)
        causal = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()
        attn = F.scaled_dot_product_attention(q, k0, v0, attn_mask=causal, scale=scale)
        outs = [self._finish(x, attn)]
        real_mask = torch.zeros(t, t, device=feats.device).masked_fill_(~causal, float("-inf"))
        drafted: list[tuple[torch.Tensor, torch.Tensor]] = []
        for s in range(1, steps + 1):
            x = self.inputs(outs[-1], tokens[:, s:s + t])
            q, k, v = self._qkv(x, pos + s)
            drafted.append((k, v))
            real = (q @ k0.transpose(-1, -2)) * scale + real_mask  # [B, Hd, T, T]
            own = torch.stack([(q * kk).sum(-1) * scale for kk, _ in drafted], dim=-1)  # [B, Hd, T, s]
            w = torch.softmax(torch.cat([real, own], dim=-1), dim=-1)
            attn = w[..., :t] @ v0
            for j, (_, vv) in enumerate(drafted):
                attn = attn + w[..., t + j:t + j + 1] * vv
            outs.append(self._finish(x, attn))
        return outs
