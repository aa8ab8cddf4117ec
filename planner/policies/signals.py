"""What the policies read off one Telemetry message, and a restorable random source.

Latency per generated token is measured per sequence: a step of ``step_time`` seconds that
emits ``num_tokens`` tokens over ``batch_size`` sequences costs each sequence
``step_time · batch_size / num_tokens`` seconds per token. That is the inter-token latency
a user sees, and it has the same unit as a one-off stall C_switch spread over γ tokens, so
Nightjar's loss ℓ + C_switch/γ adds like with like.
"""

from __future__ import annotations

import numpy as np

from shared.control import Telemetry


def is_step(t: Telemetry) -> bool:
    """A decoding step with something to learn from (heartbeats have batch_size 0)."""
    return t.batch_size > 0 and t.num_tokens > 0 and t.step_time > 0.0


def prices_gamma(t: Telemetry) -> bool:
    """A decoding step whose time is what its γ cost: no prompt was prefilled in it. A
    prefill's cost is its arrival's, whatever γ ran, and one is large next to a decode step
    (nj-target at 32 users: one γ = 0 step with 489 prompt tokens took 72 ms a token against
    15 without, and made plain decoding look slower than γ = 1 on 13 samples)."""
    return is_step(t) and t.prefill_tokens == 0


def switch_seconds(t: Telemetry) -> float:
    """Time the step spent on draft catch-up (charged separately as C_switch, not to ℓ)."""
    return sum(e.seconds for e in t.switch_costs)


def busy_time(t: Telemetry) -> float:
    """Step time without the catch-up."""
    return max(t.step_time - switch_seconds(t), 1e-9)


def tokens_per_sequence(t: Telemetry) -> float:
    return t.num_tokens / t.batch_size


def latency_per_token(t: Telemetry) -> float:
    """Seconds per generated token per sequence, catch-up excluded."""
    return busy_time(t) / tokens_per_sequence(t)


def goodput(t: Telemetry) -> float:
    """Tokens per second of the whole step (catch-up included: it is what the step delivered)."""
    return t.num_tokens / t.step_time


def acceptance(t: Telemetry) -> float | None:
    """Per-token acceptance α of the step, None when nothing was proposed.

    accepted/proposed understates α: a sequence stops at its first rejection, so the drafts
    after it are never judged. With i.i.d. acceptance each sequence accepts on average
    α(1 − α^γ)/(1 − α) drafts; α is the root of that equal to accepted/batch (bisection).
    """
    if t.proposed <= 0 or t.batch_size <= 0 or t.gamma <= 0:
        return None
    mean = min(t.accepted / t.batch_size, float(t.gamma))
    if mean >= t.gamma:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        a = 0.5 * (lo + hi)
        expected = a * (1.0 - a**t.gamma) / (1.0 - a)
        lo, hi = (a, hi) if expected < mean else (lo, a)
    return 0.5 * (lo + hi)


class Draws:
    """Uniform draws from (seed, counter): the whole random state is two integers.

    A numpy Generator's state holds 128-bit integers that msgpack cannot carry; deriving
    each draw from (seed, n) lets a restored policy make exactly the draws it would have made.
    """

    def __init__(self, seed: int, count: int = 0) -> None:
        self.seed = seed
        self.count = count

    def uniform(self) -> float:
        value = float(np.random.default_rng((self.seed, self.count)).random())
        self.count += 1
        return value

    def choice(self, weights: list[float]) -> int:
        """An index drawn with probability proportional to ``weights``."""
        total = sum(weights)
        u = self.uniform() * total
        acc = 0.0
        for i, w in enumerate(weights):
            acc += w
            if u < acc:
                return i
        return max(i for i, w in enumerate(weights) if w > 0)

    def state(self) -> list[int]:
        return [self.seed, self.count]

    @classmethod
    def from_state(cls, state: list[int]) -> Draws:
        return cls(int(state[0]), int(state[1]))
