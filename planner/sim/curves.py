"""Step-time curves of a target and its drafters, from the startup cost profile's format.

The simulator's costs are a ``shared.profile.CostProfile`` — the record a worker measures as
it starts and the planner's policies use as their prior — so simulation and serving share one
cost model and one interpolation (``shared.profile.interp``). ``CostCurves`` is the
millisecond view the simulator reads: T(B, q) for the target, D(B) per drafter, and the
catch-up per skipped token where it was measured.

Built in: the two tables measured on this project's 2-core CPU (shared/NOTES.md), fp32,
256-token context, in-place KV cache, as profiles (``RANDOM_INIT_PROFILE``,
``SMOLLM2_PROFILE``). ``RANDOM_INIT`` is the 8-layer/512-wide target with a 2-layer/256-wide
draft (draft column measured). ``SMOLLM2`` is SmolLM2-135M; it has no draft partner, so its
draft column is an assumption: 0.2 × the target's q = 1 step (NOTES: a 2-layer full-width draft
costs 0.16–0.28 of a target step). A worker's own profile replaces either:
``CostCurves.from_profile(profile)`` (or ``load_curves(path)`` for a profile saved as JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shared.profile import FLOOR_S, CostProfile, interp

DEFAULT_DRAFTER = "draft"


@dataclass(frozen=True)
class CostCurves:
    """Target step time T(B, q) and draft step time D(B) in milliseconds, as measured."""

    name: str
    batches: tuple[int, ...]
    qs: tuple[int, ...]
    target_ms: tuple[tuple[float, ...], ...]  # target_ms[i][k]: batch batches[i], q = qs[k]
    draft_ms: tuple[float, ...]  # one draft step (q = 1) of the default drafter at each batch size
    drafters_ms: dict[str, tuple[float, ...]] = field(default_factory=dict)  # other drafters by name
    catch_up_ms: tuple[float, ...] | None = None  # ms per skipped token per sequence, if measured

    def __post_init__(self) -> None:
        if len(self.target_ms) != len(self.batches) or len(self.draft_ms) != len(self.batches):
            raise ValueError("one target row and one draft value per batch size")
        if any(len(row) != len(self.qs) for row in self.target_ms):
            raise ValueError("one target value per q in every row")
        if any(len(v) != len(self.batches) for v in self.drafters_ms.values()):
            raise ValueError("one draft value per batch size for every drafter")
        if self.catch_up_ms is not None and len(self.catch_up_ms) != len(self.batches):
            raise ValueError("one catch-up value per batch size")

    def target(self, batch: float, q: float) -> float:
        """Seconds for one target pass over q tokens for each of ``batch`` sequences."""
        rows = [interp(self.qs, row, q) for row in self.target_ms]
        return max(interp(self.batches, rows, batch), FLOOR_S * 1000) / 1000.0

    def draft(self, batch: float, drafter: str | None = None) -> float:
        """Seconds for one draft step over ``batch`` sequences (drafter ``drafter`` where its
        own curve is known, else the default drafter's)."""
        ms = self.drafters_ms.get(drafter, self.draft_ms) if drafter is not None else self.draft_ms
        return max(interp(self.batches, ms, batch), FLOOR_S * 1000) / 1000.0

    def step(self, batch: float, gamma: int, drafter: str | None = None) -> float:
        """Seconds for one decoding step at γ: γ draft steps, then one verify pass over γ + 1."""
        return gamma * self.draft(batch, drafter) + self.target(batch, gamma + 1)

    def catch_up(self, batch: float, tokens: float) -> float | None:
        """Seconds to catch up ``tokens`` per sequence, where the profile measured it."""
        if self.catch_up_ms is None:
            return None
        return max(interp(self.batches, self.catch_up_ms, batch), 0.0) * tokens / 1000.0

    @classmethod
    def from_profile(cls, profile: CostProfile, drafter: str | None = None) -> CostCurves:
        """The curves of ``profile``; ``drafter`` (default: its first) is the default draft."""
        default = profile.drafter(drafter)
        ms = {n: tuple(1000.0 * s for s in v) for n, v in profile.drafter_s.items()}
        none = tuple(0.0 for _ in profile.batches)
        draft = ms.get(default, none) if default else none
        catch = profile.catch_up_s.get(default or "") or next(iter(profile.catch_up_s.values()), None)
        return cls(
            name=profile.model,
            batches=tuple(profile.batches),
            qs=tuple(profile.rows),
            target_ms=tuple(tuple(1000.0 * s for s in row) for row in profile.target_s),
            draft_ms=draft,
            drafters_ms={n: v for n, v in ms.items() if n != default},
            catch_up_ms=None if catch is None else tuple(1000.0 * s for s in catch),
        )

    def to_profile(self, drafter: str = DEFAULT_DRAFTER, source: str = "table") -> CostProfile:
        """These curves as a cost profile (seconds), the default draft named ``drafter``."""
        drafters = {drafter: [v / 1000.0 for v in self.draft_ms]}
        drafters.update({n: [v / 1000.0 for v in ms] for n, ms in self.drafters_ms.items()})
        catch = {} if self.catch_up_ms is None else {drafter: [v / 1000.0 for v in self.catch_up_ms]}
        return CostProfile(
            model=self.name, batches=list(self.batches), rows=list(self.qs),
            target_s=[[v / 1000.0 for v in row] for row in self.target_ms],
            drafter_s=drafters, catch_up_s=catch, source=source, measured_at=0.0,
        )  # fmt: skip


def load_curves(path: str | Path, drafter: str | None = None) -> CostCurves:
    """Curves from a cost profile saved as JSON (``CostProfile.dumps``)."""
    return CostCurves.from_profile(CostProfile.loads(Path(path).read_text()), drafter)


NOTES = "shared/NOTES.md (2-core CPU, fp32, 256-token context)"

RANDOM_INIT_PROFILE = CostProfile(
    model="random-init-34M/5.7M",
    batches=[1, 4, 16, 64],
    rows=[1, 2, 3, 5, 9],
    target_s=[
        [0.0104, 0.0134, 0.0152, 0.0122, 0.0146],
        [0.0157, 0.0151, 0.0173, 0.0195, 0.0249],
        [0.0219, 0.0297, 0.0359, 0.0455, 0.0669],
        [0.0580, 0.0843, 0.1098, 0.1498, 0.2375],
    ],
    drafter_s={DEFAULT_DRAFTER: [0.00089, 0.00194, 0.00298, 0.00816]},
    source=NOTES,
    measured_at=0.0,
)

_SMOL_S = [
    [0.0417, 0.0648, 0.0820, 0.0631, 0.0761],
    [0.0649, 0.0719, 0.0835, 0.0973, 0.1278],
    [0.0832, 0.1523, 0.1779, 0.2345, 0.3239],
    [0.1548, 0.2950, 0.3514, 0.4527, 0.6673],
]
SMOLLM2_PROFILE = CostProfile(
    model="smollm2-135M",
    batches=[1, 4, 16, 32],
    rows=[1, 2, 3, 5, 9],
    target_s=_SMOL_S,
    drafter_s={DEFAULT_DRAFTER: [0.2 * row[0] for row in _SMOL_S]},  # assumed: 0.2 × a target step
    source=NOTES + "; draft column assumed",
    measured_at=0.0,
)

RANDOM_INIT = CostCurves.from_profile(RANDOM_INIT_PROFILE)
SMOLLM2 = CostCurves.from_profile(SMOLLM2_PROFILE)

CURVES = {"random-init": RANDOM_INIT, "smollm2": SMOLLM2}
PROFILES = {"random-init": RANDOM_INIT_PROFILE, "smollm2": SMOLLM2_PROFILE}
