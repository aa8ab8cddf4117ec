"""LLMEngine: continuous batching over a paged KV cache with exact prefix reuse.

A step is schedule → run → postprocess. Requests, aborts, decisions and cache resizes
arrive from other threads through a locked inbox that the step drains first, so the
scheduler, block manager and cache are only ever touched by the stepping thread.

This engine runs the target alone (γ = 0). Speculation plugs in between schedule and run:
``scheduler.schedule(num_lookahead=γ)`` reserves γ slots after each decoding sequence
(``Scheduled.num_lookahead``); a drafter (its own ModelRunner + BlockManager, same request
ids) appends up to that many drafts to ``seq.token_ids`` and adds them to ``num_new``;
``_run`` then asks for ``num_logits = num_new`` rows, i.e. the γ+1 verification rows; after
verification (worker/engine/spec/verify.py) ``seq.truncate(L + accepted)`` and
``blocks.truncate(id, L + accepted)`` roll the rejected drafts back (L = length before the
drafts), and the bonus token is appended as usual.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import torch

from shared.schemas import Decision
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepResult, StepStats
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.kv_cache import blocks_for_budget
from worker.engine.logits_cache import LogitsCache
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.sampler import sample
from worker.engine.scheduler import Scheduled, Scheduler
from worker.engine.sequence import Sequence


class LLMEngine(Engine):
    def __init__(
        self, runner: ModelRunner, config: EngineConfig, eos_token_ids: frozenset[int] = frozenset()
    ) -> None:
        self.runner, self.config = runner, config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer: Any = None  # set by load_engine when the checkpoint has one
        self.blocks = BlockManager(runner.cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.logits_cache = LogitsCache(config.logits_cache_size)
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self._max_model_len(),
            self.logits_cache.get,
        )
        self._lock = threading.Lock()
        self._inbox: deque[tuple[str, Any]] = deque()
        self._seqs: dict[str, Sequence] = {}  # waiting or running
        self._decision: Decision | None = None
        self._step = 0

    # ------------------------------------------------------------ thread-safe API

    def add_request(self, request: EngineRequest) -> None:
        with self._lock:
            self._inbox.append(("add", request))

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._inbox.append(("abort", request_id))

    def apply_decision(self, decision: Decision) -> None:
        with self._lock:
            self._inbox.append(("decision", decision))

    def set_num_blocks(self, num_blocks: int) -> None:
        """Grow or shrink the KV pool at the next step (elastic memory); shrinking preempts
        the newest sequences if their blocks cannot otherwise stay."""
        if num_blocks < 2:
            raise ValueError("the KV cache needs at least 2 blocks")
        with self._lock:
            self._inbox.append(("resize", num_blocks))

    def set_memory_budget(self, budget_bytes: int) -> None:
        r = self.runner
        n = blocks_for_budget(r.config, r.block_size, r.dtype, budget_bytes, r.weight_bytes)
        self.set_num_blocks(n)

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._inbox) or bool(self._seqs)

    # ------------------------------------------------------------------- the step

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        stats = StepStats(step=self._step)
        self._step += 1
        queries0, hits0 = self.blocks.prefix_queries, self.blocks.prefix_hits
        touched: list[Sequence] = []
        self._drain_inbox(touched, stats)
        plan = self.scheduler.schedule()
        touched += plan.rejected
        stats.prefill_tokens = sum(s.num_new for s in plan.scheduled if s.seq.prefilling)
        self.runner.cache.copy(self.blocks.take_copies())
        t1 = time.perf_counter()
        rows = self._run(plan.scheduled)
        t2 = time.perf_counter()
        touched += self._postprocess(plan.scheduled, rows, stats)
        for seq in touched:
            if seq.is_finished and self._seqs.get(seq.request_id) is seq:
                del self._seqs[seq.request_id]
                self.scheduler.remove(seq)
        outputs = [self._output(seq) for seq in dict.fromkeys(touched)]
        stats.preempted = len(plan.preempted)
        stats.running = len(self.scheduler.running)
        stats.waiting = len(self.scheduler.waiting)
        running = self.scheduler.running
        stats.mean_context = sum(len(s.token_ids) for s in running) / len(running) if running else 0.0
        stats.free_blocks, stats.total_blocks = self.blocks.num_free_blocks, self.blocks.num_blocks
        stats.prefix_queries = self.blocks.prefix_queries - queries0
        stats.prefix_hits = self.blocks.prefix_hits - hits0
        stats.decision_version = self._decision.version if self._decision else 0
        stats.verify_time = t2 - t1
        stats.step_time = time.perf_counter() - t0
        stats.other_time = stats.step_time - stats.verify_time
        return StepResult(outputs, stats)

    def _run(self, scheduled: list[Scheduled]) -> list[torch.Tensor | None]:
        """The target forward; per scheduled sequence, the logits rows it asked for
        (``[num_logits, V]``: one row, or γ+1 for a verification; None while a prompt chunk
        ends before the prompt does)."""
        items, owners = [], []
        for k, s in enumerate(scheduled):
            if s.num_new == 0:
                continue
            seq, start = s.seq, s.seq.num_computed
            reaches_end = start + s.num_new == len(seq.token_ids)
            items.append(
                ForwardItem(
                    seq.token_ids[start : start + s.num_new],
                    start,
                    self.blocks.table(seq.request_id),
                    num_logits=1 if reaches_end else 0,
                )
            )
            owners.append(k)
        rows: list[torch.Tensor | None] = [
            None if s.seq.cached_logits is None else s.seq.cached_logits.unsqueeze(0) for s in scheduled
        ]
        if items:
            logits, first = self.runner.run(items)
            for item, k, f in zip(items, owners, first, strict=True):
                rows[k] = logits[f : f + item.num_logits] if item.num_logits else None
        return rows

    def _postprocess(
        self, scheduled: list[Scheduled], rows: list[torch.Tensor | None], stats: StepStats
    ) -> list[Sequence]:
        ready: list[tuple[Sequence, torch.Tensor, int]] = []
        for s, row in zip(scheduled, rows, strict=True):
            seq = s.seq
            seq.num_computed += s.num_new
            if row is None:
                self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
            else:
                ready.append((seq, row[-1], s.num_new))
        if not ready:
            return []
        tokens = sample(
            torch.stack([r for _, r, _ in ready]),
            [seq.params for seq, _, _ in ready],
            [seq.generator for seq, _, _ in ready],
        )
        for (seq, row, num_new), token in zip(ready, tokens, strict=True):
            self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
            if seq.prefilling:
                if num_new:  # freshly computed: keep it for an exact repeat
                    self.logits_cache.put(seq.token_ids, row)
                    self.blocks.cache_tail(seq.request_id, seq.token_ids)
                seq.prefilling, seq.cached_logits = False, None
            else:
                stats.batch_size += 1
            seq.append(token)
            self._check_finished(seq, token)
        stats.num_tokens = len(ready)
        return [seq for seq, _, _ in ready]

    def _check_finished(self, seq: Sequence, token: int) -> None:
        if token in self.eos_token_ids and not seq.params.ignore_eos:
            seq.finish("stop")
        elif seq.num_output >= seq.params.max_tokens or len(seq.token_ids) >= self.scheduler.max_model_len:
            seq.finish("length")

    def _output(self, seq: Sequence) -> RequestOutput:
        new = seq.output_token_ids[seq.num_reported :]
        seq.num_reported = seq.num_output
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt,
            num_output_tokens=seq.num_output,
            cached_prompt_tokens=seq.num_cached_prompt,
            error=seq.error,
        )

    # ------------------------------------------------------------------ the inbox

    def _drain_inbox(self, touched: list[Sequence], stats: StepStats) -> None:
        resizes = []
        # Requests move from the inbox to _seqs under the lock, so has_unfinished() never
        # sees a request in neither place.
        with self._lock:
            for kind, arg in self._inbox:
                if kind == "add":
                    touched += self._add(arg)
                elif kind == "abort":
                    seq = self._seqs.pop(arg, None)
                    if seq is not None:
                        self.scheduler.remove(seq)
                        seq.finish("cancelled")
                        touched.append(seq)
                elif kind == "decision":
                    self._decision = arg
                elif kind == "resize":
                    resizes.append(arg)
            self._inbox.clear()
        for num_blocks in resizes:
            stats.memory_events.append(self._resize(num_blocks))

    def _add(self, req: EngineRequest) -> list[Sequence]:
        seq = Sequence(req.request_id, list(req.prompt_token_ids), req.params, req.priority, req.arrival_time)
        if not seq.prompt_token_ids or req.request_id in self._seqs:
            seq.finish("error", "empty prompt" if not seq.prompt_token_ids else "duplicate request id")
            return [seq]
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        return []

    def _resize(self, num_blocks: int) -> dict[str, Any]:
        old, preempted = self.blocks.num_blocks, 0
        while True:
            try:
                moves = self.blocks.resize(num_blocks)
                break
            except ValueError:
                if not self.scheduler.running:
                    raise
                self.scheduler.preempt(max(self.scheduler.running, key=Sequence.sort_key))
                preempted += 1
        self.runner.cache.resize(num_blocks, moves)
        self.scheduler.max_model_len = self._max_model_len()
        return {
            "kind": "kv_resize",
            "from_blocks": old,
            "to_blocks": num_blocks,
            "moved_blocks": len(moves),
            "preempted": preempted,
        }

    def _max_model_len(self) -> int:
        # One block stays spare so a copy-on-write never finds the pool exactly full.
        capacity = (self.runner.cache.num_blocks - 1) * self.config.block_size
        limits = [self.runner.config.max_model_len, capacity]
        if self.config.max_model_len:
            limits.append(self.config.max_model_len)
        return min(limits)
