"""LLMEngine: continuous batching over a paged KV cache with exact prefix reuse, and
speculative decoding with a per-step γ, a drafter pool and elastic draft memory.

A step is schedule → draft → run → verify → postprocess. Requests, aborts, decisions and
cache resizes arrive from other threads through a locked inbox that the step drains first,
so the scheduler, block managers and caches are only ever touched by the stepping thread.

Speculation (worker/engine/spec/): γ comes from the latest planner decision at the batch
size of decoding sequences; the scheduler reserves γ slots after each decoding sequence, the
active drafter appends its drafts, and one target forward computes γ+1 rows per decoding
sequence next to the prefill chunks of others. Verification (greedy or rejection sampling)
emits 1..γ+1 tokens per sequence; rejected drafts are rolled back in the target
(``Sequence.truncate`` + ``BlockManager.truncate``) and in every drafter. γ = 0 runs no
draft work at all; the draft's offload and reload (``spec/memory.py``) happen at step starts.
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
from worker.engine.kv_cache import blocks_for_budget, bytes_per_block
from worker.engine.logits_cache import LogitsCache
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.scheduler import Scheduled, Scheduler
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.pool import DrafterPool
from worker.engine.spec.speculator import Drafted, Speculator, Verified
from worker.engine.spec.verify import verify_batch

# Per scheduled sequence: its logits rows ([num_logits, V]) and their argmax, or None.
Rows = list[tuple[torch.Tensor, list[int]] | None]


class LLMEngine(Engine):
    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig,
        eos_token_ids: frozenset[int] = frozenset(),
        drafters: list[Drafter] | None = None,
    ) -> None:
        """``drafters``: model drafters (each with its own runner and KV pool of the target's
        block count) and/or the n-gram drafter; none means the engine never speculates."""
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
        pool = DrafterPool(drafters, config.counterfactual_every) if drafters else None
        self.memory = ElasticMemory(
            pool.models if pool else [],
            bytes_per_block(runner.config, config.block_size, runner.dtype),
            lambda: self.blocks.num_blocks,
            self._resize,
            pool.reset if pool else lambda: None,
        )
        self.spec = Speculator(pool, self.memory, config.max_gamma)

    @property
    def drafter_names(self) -> list[str]:
        return list(self.spec.pool.drafters) if self.spec.pool else []

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
        """Size the target's KV pool from a budget that also holds the resident drafters."""
        r = self.runner
        drafts = self.memory.bytes if self.memory.resident else 0
        n = blocks_for_budget(r.config, r.block_size, r.dtype, budget_bytes - drafts, r.weight_bytes)
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
        stats.memory_events += self.memory.update(bool(self._decision and self._decision.offload))
        decoding = sum(1 for s in self.scheduler.running if not s.prefilling)
        gamma, drafter = self.spec.choose(self._decision, decoding)
        plan = self.scheduler.schedule(num_lookahead=gamma)
        for seq in plan.preempted:
            self.spec.free(seq.request_id)
        touched += plan.rejected
        stats.prefill_tokens = sum(s.num_new for s in plan.scheduled if s.seq.prefilling)
        self.runner.cache.copy(self.blocks.take_copies())
        drafts = self.spec.draft(drafter, plan.scheduled, stats)
        stats.gamma = gamma if drafts else 0
        t1 = time.perf_counter()
        rows = self._run(plan.scheduled)
        verified: list[Verified] = []
        touched += self._postprocess(plan.scheduled, rows, drafts, stats, verified)
        t2 = time.perf_counter()
        if drafter is not None:
            self.spec.feedback(drafter, verified, stats)
        for seq in touched:
            if seq.is_finished and self._seqs.get(seq.request_id) is seq:
                del self._seqs[seq.request_id]
                self.scheduler.remove(seq)
                self.spec.free(seq.request_id)
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
        stats.draft_resident = self.memory.resident
        stats.verify_time = t2 - t1
        stats.step_time = time.perf_counter() - t0
        stats.other_time = stats.step_time - stats.verify_time - stats.draft_time
        return StepResult(outputs, stats)

    def _run(self, scheduled: list[Scheduled]) -> Rows:
        """The target forward; per scheduled sequence, the logits rows it asked for and their
        argmax: one row for a decode or a prompt's end, γ+1 for a verification; None while a
        prompt chunk ends before the prompt does."""
        items, owners = [], []
        for k, s in enumerate(scheduled):
            if s.num_new == 0:
                continue
            seq, start = s.seq, s.seq.num_computed
            reaches_end = start + s.num_new == len(seq.token_ids)
            wanted = (1 if seq.prefilling else s.num_new) if reaches_end else 0
            items.append(
                ForwardItem(
                    seq.token_ids[start : start + s.num_new], start, self.blocks.table(seq.request_id), wanted
                )
            )
            owners.append(k)
        rows: Rows = [None] * len(scheduled)
        for k, s in enumerate(scheduled):
            if s.seq.cached_logits is not None:
                cached = s.seq.cached_logits.unsqueeze(0)
                rows[k] = (cached, cached.argmax(-1).tolist())
        if items:
            logits, first = self.runner.run(items)
            ids = logits.argmax(-1).tolist()  # one pass over every row; greedy rows use it
            for item, k, f in zip(items, owners, first, strict=True):
                if item.num_logits:
                    rows[k] = (logits[f : f + item.num_logits], ids[f : f + item.num_logits])
        return rows

    def _postprocess(
        self,
        scheduled: list[Scheduled],
        rows: Rows,
        drafts: dict[str, Drafted],
        stats: StepStats,
        verified: list[Verified],
    ) -> list[Sequence]:
        ready: list[tuple[Scheduled, torch.Tensor, list[int], Drafted | None]] = []
        for s, row in zip(scheduled, rows, strict=True):
            seq = s.seq
            seq.num_computed += s.num_new
            if row is None:
                self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
            else:
                ready.append((s, row[0], row[1], drafts.get(seq.request_id)))
        if not ready:
            return []
        emitted, p_rows = verify_batch(
            [ids for _, _, ids, _ in ready],
            [r for _, r, _, _ in ready],
            [d.tokens if d else [] for _, _, _, d in ready],
            [d.q if d else None for _, _, _, d in ready],
            [s.seq.params for s, _, _, _ in ready],
            [s.seq.generator for s, _, _, _ in ready],
        )
        for (s, logits, _, d), out, p in zip(ready, emitted, p_rows, strict=True):
            seq = s.seq
            start = len(seq.token_ids) - (len(d.tokens) if d else 0)
            keep = self._keep(seq, start, out)
            if d is not None:
                # Rejected drafts (and any cut after an EOS) leave every cache.
                seq.truncate(start + keep - 1)
                self.blocks.truncate(seq.request_id, start + keep - 1)
                self.spec.rollback(seq.request_id, start + keep - 1)
            self.blocks.commit(seq.request_id, seq.token_ids, seq.num_computed)
            if seq.prefilling:
                if s.num_new:  # freshly computed: keep it for an exact repeat
                    self.logits_cache.put(seq.token_ids, logits[-1])
                    self.blocks.cache_tail(seq.request_id, seq.token_ids)
                seq.prefilling, seq.cached_logits = False, None
            else:
                stats.batch_size += 1
            seq.append(out[keep - 1])
            self._check_finished(seq, out[keep - 1])
            stats.num_tokens += keep
            if d is not None:
                verified.append(Verified(seq, d, len(out), p))
        return [s.seq for s, _, _, _ in ready]

    def _keep(self, seq: Sequence, start: int, out: list[int]) -> int:
        """How many of the emitted tokens stand: up to the first EOS, within max_tokens and
        the longest context (the scheduler's γ caps make the last two hold already)."""
        keep = len(out)
        if not seq.params.ignore_eos:
            keep = next((j + 1 for j, t in enumerate(out) if t in self.eos_token_ids), keep)
        room = min(seq.params.max_tokens - (start - seq.num_prompt), self.scheduler.max_model_len - start)
        return max(1, min(keep, room))

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
                        self.spec.free(seq.request_id)
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
        t0 = time.perf_counter()
        old, preempted = self.blocks.num_blocks, 0
        while True:
            try:
                moves = self.blocks.resize(num_blocks)
                break
            except ValueError:
                if not self.scheduler.running:
                    raise
                victim = max(self.scheduler.running, key=Sequence.sort_key)
                self.scheduler.preempt(victim)
                self.spec.free(victim.request_id)
                preempted += 1
        self.runner.cache.resize(num_blocks, moves)
        self.scheduler.max_model_len = self._max_model_len()
        return {
            "kind": "kv_resize",
            "seconds": time.perf_counter() - t0,
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
