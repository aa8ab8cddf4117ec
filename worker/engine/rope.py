"""Rotary position embeddings, computed exactly as transformers computes them.

Inverse frequencies follow the ``rope_type`` of the config (default, linear, llama3); cos/sin
are formed once per forward from the batch's positions in fp32 and cast to the model dtype,
so every layer shares them.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(rope: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim // 2] fp32, attention_scaling)`` for a normalised rope dict."""
    dim = int(rope["head_dim"])
    base = float(rope["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / float(rope["factor"]), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, rope), 1.0
    raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3)")


def _llama3(inv_freq: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    factor = float(rope["factor"])
    low_freq_factor = float(rope["low_freq_factor"])
    high_freq_factor = float(rope["high_freq_factor"])
    old_context_len = float(rope["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary:
    """Applies rotary embeddings to rows of heads: ``x [T, heads, head_dim]``."""

    def __init__(self, rope: dict[str, Any], device: torch.device, dtype: torch.dtype) -> None:
        inv_freq, self.scaling = inverse_frequencies(rope)
        self.inv_freq = inv_freq.to(device)
        self.dtype = dtype
        self._cos = self._sin = torch.empty(0, inv_freq.numel(), device=device, dtype=dtype)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.unsqueeze(-1).float() * self.inv_freq
        cos, sin = freqs.cos(), freqs.sin()
        if self.scaling != 1.0:
            cos, sin = cos * self.scaling, sin * self.scaling
        return cos.to(self.dtype), sin.to(self.dtype)

    def table(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin [P, head_dim // 2]`` of positions ``0 .. P-1``, ``P >= size``: computed
        once (grown by doubling) and shared by every forward."""
        if self._cos.shape[0] < size:
            grown = max(size, 2 * self._cos.shape[0], 256)
            self._cos, self._sin = self._compute(torch.arange(grown, device=self.inv_freq.device))
        return self._cos, self._sin

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Half-width ``cos, sin [T, 1, head_dim // 2]``: transformers concatenates the
        frequencies with themselves, so both halves of a head use the same values. On a CPU
        they are rows of ``table``, so the op-by-op path and the fused one (which reads the
        table) rotate a position by the same values."""
        if positions.device.type == "cpu" and positions.numel():
            cos, sin = self.table(int(positions.max()) + 1)
            return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        cos, sin = self._compute(positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x·cos + rotate_half(x)·sin`` written per half (same rounding as transformers:
        ``a + (−b)·s`` equals ``a − b·s`` exactly)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
