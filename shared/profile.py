"""The cost profile: what one decoding step costs on one worker, as measured at its start.

One typed record shared by the worker's startup profiler (which measures it), the planner's
policies (which use it as their prior) and the planner simulator (``planner/sim``, whose cost
curves are built from it), so simulation and serving use one cost model:

- ``target_s[i][k]``: seconds of one target forward over ``rows[k]`` tokens per sequence
  (q = γ + 1: the verify pass of a step at γ) for ``batches[i]`` sequences;
- ``drafter_s[name][i]``: seconds of one draft step (one token per sequence) of that drafter
  for ``batches[i]`` sequences;
- ``catch_up_s[name][i]``: seconds per skipped token per sequence when that drafter catches up
  after speculation was off, for ``batches[i]`` sequences (a catch-up of L tokens costs
  ``L · catch_up_s``); a drafter without an entry has no measured catch-up;
- ``context``: the mean tokens per sequence (prompt and output) ``target_s`` was measured at;
  ``long_target_s``, when present, is the same table measured at ``long_context`` tokens. A
  forward's time grows with the context it attends over and gathers (nj-target at batch 32:
  8.3 ms at ~30 tokens, 13.1 ms at ~140), so ``target(…, context)`` is linear in the context
  through the two tables (without a second table, or without a context, it is ``target_s``).

Between and beyond the measured points every value is piecewise-linear (``interp``), over
batch size first and then over rows. ``num_blocks`` is the KV pool the profile was measured
with (a profile is re-measured for the pool after an offload). JSON round-trips it
(``dumps``/``loads``), so it can be published beside the worker's model name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

FLOOR_S = 1e-5  # no interpolated or extrapolated time goes below this


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class CostProfile(BaseModel):
    """Step costs of one worker's target and drafters, by batch bucket (and rows per sequence)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)  # the worker's model name
    batches: list[int] = Field(min_length=1)  # batch sizes measured, ascending
    rows: list[int] = Field(min_length=1)  # rows per sequence measured (q = γ + 1), ascending, from 1
    target_s: list[list[float]]  # target_s[i][k]: batch batches[i], q = rows[k]
    drafter_s: dict[str, list[float]] = Field(default_factory=dict)  # drafter -> seconds per batch
    catch_up_s: dict[str, list[float]] = Field(default_factory=dict)  # drafter -> s/token per batch
    context: float = Field(default=0.0, ge=0.0)  # tokens per sequence target_s was measured at (0: unknown)
    long_context: float = Field(default=0.0, ge=0.0)  # ... and long_target_s
    long_target_s: list[list[float]] = Field(default_factory=list)  # target_s at long_context (or empty)
    num_blocks: int | None = Field(default=None, ge=0)  # the KV pool it was measured with
    device: str = "cpu"
    weights: str = ""  # the target's weights as measured ("Q4_1+Q8_0": GGUF blocks, "float32"; "": unknown)
    worker_id: str | None = None
    source: str = "startup"  # "startup" (measured by the worker) or where a table came from
    measured_at: float = Field(default_factory=time.time)
    measure_s: float = Field(default=0.0, ge=0.0)  # how long measuring took

    @model_validator(mode="after")
    def _shape(self) -> CostProfile:
        if sorted(set(self.batches)) != self.batches or self.batches[0] < 1:
            raise ValueError("batches must be distinct, ascending and ≥ 1")
        if sorted(set(self.rows)) != self.rows or self.rows[0] < 1:
            raise ValueError("rows must be distinct, ascending and ≥ 1")
        if len(self.target_s) != len(self.batches) or any(len(r) != len(self.rows) for r in self.target_s):
            raise ValueError("target_s needs one row per batch size and one value per rows entry")
        if self.long_target_s and (
            len(self.long_target_s) != len(self.batches)
            or any(len(r) != len(self.rows) for r in self.long_target_s)
            or not self.long_context > self.context > 0
        ):
            raise ValueError("long_target_s needs target_s's shape and long_context > context > 0")
        for what, table in (("drafter_s", self.drafter_s), ("catch_up_s", self.catch_up_s)):
            for name, values in table.items():
                if len(values) != len(self.batches):
                    raise ValueError(f"{what}[{name!r}] needs one value per batch size")
        values = [v for r in self.target_s + self.long_target_s for v in r]
        values += [v for t in (self.drafter_s, self.catch_up_s) for vs in t.values() for v in vs]
        if any(not v >= 0.0 or v == float("inf") for v in values):
            raise ValueError("every time must be finite and ≥ 0")
        return self

    @property
    def gamma_max(self) -> int:
        """The largest γ whose verify pass was measured (rows up to γ + 1)."""
        return self.rows[-1] - 1

    def target(self, batch: float, rows: float, context: float | None = None) -> float:
        """Seconds of one target forward over ``rows`` tokens for each of ``batch`` sequences
        (at ``context`` tokens a sequence, where the profile measured two contexts)."""
        short = self._table(self.target_s, batch, rows)
        if context is None or not self.long_target_s:
            return short
        long = self._table(self.long_target_s, batch, rows)
        return max(interp([self.context, self.long_context], [short, long], context), FLOOR_S)

    def _table(self, table: list[list[float]], batch: float, rows: float) -> float:
        by_batch = [interp(self.rows, r, rows) for r in table]
        return max(interp(self.batches, by_batch, batch), FLOOR_S)

    def drafter(self, name: str | None = None) -> str | None:
        """``name`` if it was measured, else the first drafter measured (None: no drafter)."""
        if name is not None and name in self.drafter_s:
            return name
        return next(iter(self.drafter_s), None)

    def draft(self, batch: float, name: str | None = None) -> float:
        """Seconds of one draft step of drafter ``name`` (default: the first one) at ``batch``."""
        d = self.drafter(name)
        return 0.0 if d is None else max(interp(self.batches, self.drafter_s[d], batch), FLOOR_S)

    def step(self, batch: float, gamma: int, name: str | None = None, context: float | None = None) -> float:
        """Seconds of one decoding step at γ: γ draft steps, then a verify pass over γ + 1 rows."""
        return gamma * self.draft(batch, name) + self.target(batch, gamma + 1, context)

    def catch_up(self, batch: float, tokens: float, name: str | None = None) -> float | None:
        """Seconds a drafter needs to catch up ``tokens`` skipped tokens per sequence (None when
        this drafter's catch-up was not measured)."""
        d = name if name in self.catch_up_s else next(iter(self.catch_up_s), None)
        if d is None:
            return None
        return max(interp(self.batches, self.catch_up_s[d], batch), 0.0) * tokens

    def dumps(self) -> str:
        return self.model_dump_json()

    @classmethod
    def loads(cls, text: str | bytes) -> CostProfile:
        return cls.model_validate_json(text)
