"""C_switch: what turning speculation back on costs, learned from the workers' measurements.

When γ goes from 0 to > 0 the draft model must first catch up on the tokens it skipped (a
draft prefill of up to L tokens for each of B sequences). Workers report every catch-up as a
SwitchCostEvent (drafter, batch size, tokens, seconds). The model keeps, per drafter, a
log-log grid over (tokens, batch) whose nodes hold the running mean of measured/prior
ratios; a query interpolates that ratio bilinearly (nodes without data take the mean of the
measured ones) and multiplies the prior. Before any measurement the prior alone answers:
``fixed + per_token_seq · tokens · batch`` seconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from shared.control import SwitchCostEvent

TOKEN_GRID = [1 << i for i in range(13)]  # 1 … 4096 skipped tokens
BATCH_GRID = [1 << i for i in range(10)]  # 1 … 512 sequences
POOLED = "*"  # every drafter together: the fallback for one not yet measured
WINDOW = 32  # a node's mean follows the last ~WINDOW measurements (costs drift slowly)


def _position(grid: list[int], x: float) -> tuple[int, float]:
    """Lower node index and fractional offset of ``x`` on a power-of-two grid (clamped)."""
    p = min(max(math.log2(max(x, 1.0)), 0.0), len(grid) - 1.0)
    i = min(int(p), len(grid) - 2)
    return i, p - i


class SwitchCostModel:
    """Interpolated C_switch(drafter, tokens, batch) in seconds."""

    def __init__(self, per_token_seq: float = 1e-4, fixed: float = 1e-3) -> None:
        self.per_token_seq = per_token_seq
        self.fixed = fixed
        # drafter -> "ti,bi" -> [mean ratio, count]
        self.nodes: dict[str, dict[str, list[float]]] = {}
        # C_switch(drafter, tokens, batch) before any measurement, where known: the startup
        # cost profile's catch-up (nightjar sets it; not state)
        self.before: Callable[[str | None, float, float], float | None] | None = None

    def prior(self, tokens: float, batch: float) -> float:
        return self.fixed + self.per_token_seq * tokens * batch

    def observe(self, event: SwitchCostEvent) -> None:
        if event.tokens <= 0 or event.batch_size <= 0 or event.seconds < 0:
            return
        ratio = event.seconds / self.prior(event.tokens, event.batch_size)
        ti, tf = _position(TOKEN_GRID, event.tokens)
        bi, bf = _position(BATCH_GRID, event.batch_size)
        key = f"{ti + round(tf)},{bi + round(bf)}"
        for name in (event.drafter, POOLED):
            node = self.nodes.setdefault(name, {}).setdefault(key, [0.0, 0.0])
            node[1] += 1
            node[0] += (ratio - node[0]) / min(node[1], WINDOW)

    def measured(self, drafter: str | None = None) -> bool:
        return bool(self.nodes.get(drafter or POOLED) or self.nodes.get(POOLED))

    def cost(self, drafter: str | None, tokens: float, batch: float) -> float:
        """Expected catch-up seconds for ``tokens`` skipped tokens over ``batch`` sequences."""
        if tokens <= 0 or batch <= 0:
            return 0.0
        nodes = self.nodes.get(drafter or POOLED) or self.nodes.get(POOLED)
        if not nodes:
            guess = self.before(drafter, tokens, batch) if self.before is not None else None
            return guess if guess is not None else self.prior(tokens, batch)
        default = sum(v[0] for v in nodes.values()) / len(nodes)
        ti, tf = _position(TOKEN_GRID, tokens)
        bi, bf = _position(BATCH_GRID, batch)
        ratio = 0.0
        for dt, wt in ((0, 1 - tf), (1, tf)):
            for db, wb in ((0, 1 - bf), (1, bf)):
                if wt * wb > 0:
                    node = nodes.get(f"{ti + dt},{bi + db}")
                    ratio += wt * wb * (node[0] if node else default)
        return self.prior(tokens, batch) * ratio

    def state_dict(self) -> dict[str, Any]:
        return {"nodes": {d: {k: list(v) for k, v in n.items()} for d, n in self.nodes.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.nodes = {
            d: {k: [float(v[0]), float(v[1])] for k, v in n.items()} for d, n in state["nodes"].items()
        }
