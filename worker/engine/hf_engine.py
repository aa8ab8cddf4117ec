"""A small, correct Engine on plain transformers: the stand-in until the paged engine lands.

One ``DynamicCache`` per request and one forward per request per step (no batching): slow,
but its greedy output is exactly transformers' own ``generate``, which makes it the
reference the services are built and tested against. ``worker.engine_factory`` picks it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from shared.schemas import Decision, SamplingParams
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepResult, StepStats

log = logging.getLogger(__name__)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from 1-D ``logits``: argmax when greedy, else temperature / top-k / top-p."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (keeps at least one).
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        scores[order[drop]] = float("-inf")
    probs = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class _Sequence:
    request: EngineRequest
    generator: torch.Generator
    output: list[int] = field(default_factory=list)
    cache: DynamicCache | None = None


class HFEngine(Engine):
    """Runs requests one forward each per step on a transformers causal LM."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_running: int = 16,
        dtype: str = "float32",
        device: str = "cpu",
    ) -> None:
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.max_running = max_running
        self.max_len: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self.eos_token_ids = frozenset(_eos_ids(self.model))
        self._lock = threading.Lock()
        self._inbox: list[EngineRequest] = []
        self._aborts: set[str] = set()
        self._decision: Decision | None = None
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._step = 0

    # -- called from the event loop ------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        with self._lock:
            self._inbox.append(request)

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._aborts.add(request_id)

    def apply_decision(self, decision: Decision) -> None:
        # Nothing to tune without speculation; kept so telemetry reports the version in force.
        with self._lock:
            self._decision = decision

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._inbox or self._aborts or self._waiting or self._running)

    # -- called from the engine thread -----------------------------------------------------
    def step(self) -> StepResult:
        t0 = time.perf_counter()
        self._step += 1
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, set()
            decision = self._decision
        for req in inbox:
            gen = torch.Generator().manual_seed(
                req.params.seed if req.params.seed is not None else secrets.randbits(63)
            )
            self._waiting.append(_Sequence(req, gen))
        self._waiting.sort(key=lambda s: (s.request.priority, s.request.arrival_time))
        outputs = [self._finish(s, "cancelled") for s in self._take(aborts)]
        while self._waiting and len(self._running) < self.max_running:
            self._running.append(self._waiting.pop(0))

        stats = StepStats(step=self._step, decision_version=decision.version if decision else 0)
        with torch.inference_mode():
            for seq in list(self._running):
                outputs.append(self._advance(seq, stats))
        stats.running = len(self._running)
        stats.waiting = len(self._waiting)
        stats.mean_context = (
            sum(len(s.request.prompt_token_ids) + len(s.output) for s in self._running) / stats.running
            if stats.running
            else 0.0
        )
        stats.step_time = time.perf_counter() - t0
        return StepResult(outputs, stats)

    def _advance(self, seq: _Sequence, stats: StepStats) -> RequestOutput:
        req = seq.request
        prompt_len = len(req.prompt_token_ids)
        if seq.cache is None:
            if self.max_len is not None and prompt_len >= self.max_len:
                self._running.remove(seq)
                out = self._finish(seq, "error")
                out.error = f"prompt of {prompt_len} tokens does not fit the context of {self.max_len}"
                return out
            seq.cache = DynamicCache()
            ids = req.prompt_token_ids
            stats.prefill_tokens += len(ids)
        else:
            ids = seq.output[-1:]
            stats.batch_size += 1
        try:
            logits = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                cache=seq.cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[0, -1]
            token = sample_token(logits, req.params, seq.generator)
        except Exception as exc:  # a failure of one request must not stop the others
            log.exception("request %s failed", req.request_id)
            self._running.remove(seq)
            out = self._finish(seq, "error")
            out.error = f"{type(exc).__name__}: {exc}"
            return out
        seq.output.append(token)
        stats.num_tokens += 1
        reason = None
        if token in self.eos_token_ids and not req.params.ignore_eos:
            reason = "stop"
        elif len(seq.output) >= req.params.max_tokens or (
            self.max_len is not None and prompt_len + len(seq.output) >= self.max_len
        ):
            reason = "length"
        if reason is None:
            return RequestOutput(req.request_id, [token], False, None, prompt_len, len(seq.output))
        self._running.remove(seq)
        out = self._finish(seq, reason)
        out.new_token_ids = [token]
        return out

    def _take(self, request_ids: set[str]) -> list[_Sequence]:
        taken = [s for s in self._waiting + self._running if s.request.request_id in request_ids]
        self._waiting = [s for s in self._waiting if s not in taken]
        self._running = [s for s in self._running if s not in taken]
        return taken

    @staticmethod
    def _finish(seq: _Sequence, reason: str) -> RequestOutput:
        seq.cache = None
        return RequestOutput(
            seq.request.request_id,
            [],
            finished=True,
            finish_reason=reason,
            num_prompt_tokens=len(seq.request.prompt_token_ids),
            num_output_tokens=len(seq.output),
        )


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids
