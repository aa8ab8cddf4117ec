"""An engine without a model: it emits tokens at the rate of a cost profile.

For measuring the control plane (benchmarks/control_plane.py): a worker on this engine runs
the real intake, leases, outbox, telemetry and heartbeats, while its steps cost what
``profile.step(batch, 0)`` says — slept, not computed, so a few cores can host many workers.
Each step admits what was added (up to ``max_batch`` running), sleeps the step's time, and
gives every running request its next token (a fixed cycle of ``token_ids``, never EOS) until
its ``max_tokens``. Torch-free, like the contract it implements (worker/engine/api.py).

Made by ``worker.engine_factory.create_engine`` with ``--engine-opt engine=synthetic``, and
``profile=PATH`` (a CostProfile JSON) or ``base_ms`` / ``per_seq_ms`` (a step of b sequences
takes base + b · per_seq milliseconds).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from shared.profile import CostProfile
from shared.schemas import FinishReason
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepResult, StepStats
from worker.engine.spec.speculation_plan import SpeculationPlan

DEFAULT_TOKENS = (284, 285, 286, 287)  # any ids of the tokenizer's: ordinary word pieces


def linear_profile(
    base_ms: float, per_seq_ms: float, max_batch: int, model: str = "synthetic"
) -> CostProfile:
    batches = sorted({1, *[b for b in (2, 4, 8, 16, 32, 64, 128, 256) if b < max_batch], max_batch})
    return CostProfile(
        model=model,
        batches=batches,
        rows=[1],
        target_s=[[(base_ms + per_seq_ms * b) / 1000] for b in batches],
        source="synthetic",
    )


@dataclass
class _Seq:
    req: EngineRequest
    done: int = 0


class SyntheticEngine(Engine):
    def __init__(
        self,
        profile: CostProfile,
        max_batch: int = 64,
        token_ids: tuple[int, ...] = DEFAULT_TOKENS,
        max_model_len: int = 4096,
    ) -> None:
        self.profile = profile
        self.max_batch = max_batch
        self.token_ids = token_ids
        self._max_model_len = max_model_len
        self._lock = threading.Lock()
        self._inbox: deque[EngineRequest] = deque()
        self._aborts: set[str] = set()
        self._running: dict[str, _Seq] = {}
        self._step = 0
        self.plan: SpeculationPlan | None = None

    @classmethod
    def from_options(
        cls,
        profile: str | None = None,
        base_ms: float = 20.0,
        per_seq_ms: float = 0.15,
        max_batch: int = 64,
        max_model_len: int = 4096,
    ) -> SyntheticEngine:
        cost = (
            CostProfile.loads(Path(profile).read_text())
            if profile
            else linear_profile(base_ms, per_seq_ms, max_batch)
        )
        return cls(cost, max_batch=max_batch, max_model_len=max_model_len)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def add_request(self, request: EngineRequest) -> None:
        with self._lock:
            self._inbox.append(request)

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)

    def apply_plan(self, plan: SpeculationPlan) -> None:
        self.plan = plan

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._running or self._inbox or self._aborts)

    def step(self) -> StepResult:
        outputs: list[RequestOutput] = []
        with self._lock:
            aborts, self._aborts = self._aborts, set()
            while self._inbox and len(self._running) < self.max_batch:
                req = self._inbox.popleft()
                self._running[req.request_id] = _Seq(req)
            waiting = len(self._inbox)
        for rid in aborts:
            seq = self._running.pop(rid, None)
            if seq is not None:
                outputs.append(self._out(seq, [], FinishReason.CANCELLED))
        batch = len(self._running)
        step_s = self.profile.step(batch, 0) if batch else 0.0
        if batch:
            time.sleep(step_s)  # the step's cost, without its compute
        for rid, seq in list(self._running.items()):
            token = self.token_ids[(seq.done + len(seq.req.prompt_token_ids)) % len(self.token_ids)]
            seq.done += 1
            limit = seq.req.params.max_tokens or 16
            finished = seq.done >= limit
            if finished:
                del self._running[rid]
            outputs.append(self._out(seq, [token], FinishReason.LENGTH if finished else None))
        self._step += 1
        stats = StepStats(
            step=self._step,
            batch_size=batch,
            num_tokens=batch,
            step_time=step_s,
            verify_time=step_s,
            running=len(self._running),
            waiting=waiting,
            decision_version=self.plan.version if self.plan else 0,
        )
        return StepResult(outputs, stats)

    @staticmethod
    def _out(seq: _Seq, tokens: list[int], reason: FinishReason | None) -> RequestOutput:
        return RequestOutput(
            request_id=seq.req.request_id,
            new_token_ids=tokens,
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=len(seq.req.prompt_token_ids),
            num_output_tokens=seq.done,
        )
