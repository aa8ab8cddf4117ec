"""The worker's Prometheus metrics: scheduler state, KV cache, speculation, elastic memory.

Observed from what the worker already has: each engine step's ``StepStats`` (as the outbox
writes its telemetry) and each job's final event (as its write lands). Names follow vLLM's
(``vllm:num_requests_running`` → ``nightjar:num_requests_running``), labelled by model and
worker; speculation counters also by drafter, acceptance also by draft position. vLLM's own
families, with vLLM's names and labels, come beside them (``self.vllm``:
worker/vllm_metrics.py).
"""

from __future__ import annotations

import logging
from typing import Any

from shared.control import StepStats
from shared.metrics import ITL_BUCKETS, MOVE_BUCKETS, STEP_BUCKETS, MetricSet
from shared.schemas import ErrorEvent, FinishEvent, JobRequest
from worker.job_run import JobRun
from worker.vllm_metrics import VllmMetrics

log = logging.getLogger("worker.jobs")

MW = ("model", "worker")


class WorkerMetrics(MetricSet):
    def __init__(self, model: str, worker: str, max_model_len: int = 0) -> None:
        super().__init__()
        self.vllm = VllmMetrics(model, worker, max_model_len)
        self.labels = {"model": model, "worker": worker}
        self.model, self.worker = model, worker
        g, c, h = self.gauge, self.counter, self.histogram
        self.running = g("num_requests_running", "Sequences running in the engine (last step).", MW)
        self.waiting = g("num_requests_waiting", "Sequences waiting in the engine (last step).", MW)
        self.kv_usage = g("kv_cache_usage_perc", "KV-cache blocks in use, 0..1 (1 = full).", MW)
        self.kv_blocks = g("kv_cache_blocks", "KV-cache blocks in the target's pool.", MW)
        self.prefix_queries = c("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", MW)
        self.prefix_hits = c("prefix_cache_hits", "Prompt tokens served from the prefix cache.", MW)
        self.preemptions = c("num_preemptions", "Sequences preempted (recomputed later).", MW)
        self.steps = c("engine_steps", "Engine steps that did work.", MW)
        self.step_time = h("step_time_seconds", "Engine step time.", MW, STEP_BUCKETS)
        self.tokens = c("engine_generated_tokens", "Tokens the engine emitted, all sequences.", MW)
        self.prefill = c("engine_prefill_tokens", "Prompt tokens the engine computed.", MW)
        self.drafts = c(
            "spec_decode_num_drafts",
            "Speculative drafts (one per decoding sequence per step).",
            (*MW, "drafter"),
        )
        self.draft_tokens = c("spec_decode_num_draft_tokens", "Draft tokens proposed.", (*MW, "drafter"))
        self.accepted = c("spec_decode_num_accepted_tokens", "Draft tokens accepted.", (*MW, "drafter"))
        self.accepted_pos = c(
            "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0 = first).",
            (*MW, "drafter", "position"),
        )
        self.gamma = g("spec_decode_gamma", "γ run by the last working step (0: no speculation).", MW)
        self.gamma_steps = c("spec_decode_gamma_steps", "Working steps by the γ they ran.", (*MW, "gamma"))
        self.drafter_steps = c(
            "spec_decode_drafter_steps", "Steps that drafted, by drafter.", (*MW, "drafter")
        )
        self.counterfactual = g(
            "spec_decode_counterfactual_acceptance",
            "Last counterfactual acceptance rate of each drafter on the verified tokens.",
            (*MW, "drafter"),
        )
        self.resident = g("draft_resident", "1 while the drafters' weights are on the device.", MW)
        self.memory_events = c(
            "memory_events", "Elastic-memory events: offload, reload, kv_resize.", (*MW, "event")
        )
        self.memory_seconds = h(
            "memory_event_duration_seconds",
            "Duration of elastic-memory events.",
            (*MW, "event"),
            MOVE_BUCKETS,
        )
        self.switch_seconds = h(
            "spec_decode_switch_cost_seconds",
            "Drafter catch-up after a switch.",
            (*MW, "drafter"),
            ITL_BUCKETS,
        )
        self.decision_version = g("decision_version", "Planner decision version in force (0: fallback).", MW)
        self.fallback = g("decision_fallback", "1 while the built-in fallback rule is in force.", MW)
        self.jobs = c("worker_jobs_finished", "Jobs this worker finished, by outcome.", (*MW, "outcome"))
        self.job_attempts = c("worker_job_attempts", "Deliveries of the jobs finished here.", MW)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        for metric in (self.running, self.waiting, self.kv_usage, self.kv_blocks, self.prefix_queries,
                       self.prefix_hits, self.preemptions, self.steps, self.step_time, self.tokens,
                       self.prefill, self.gamma, self.decision_version, self.fallback,
                       self.job_attempts):  # fmt: skip
            self._c(metric)  # exported (at 0) from the start, so rates have a beginning
        self._c(self.resident).set(1)

    def _c(self, metric: Any, *extra: str) -> Any:
        """``metric``'s child for this worker (and ``extra`` labels), looked up once."""
        key = (id(metric), extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model, self.worker, *extra)
        return child

    def observe_idle(self) -> None:
        """An idle heartbeat: nothing runs or waits in the engine."""
        self._c(self.running).set(0)
        self._c(self.waiting).set(0)
        self.vllm.observe_idle()

    def observe_step(self, s: StepStats, decision_version: int, fallback: bool) -> None:
        """One engine step that ran (its stats as the telemetry carries them)."""
        self.vllm.observe_step(s)
        c = self._c
        c(self.running).set(s.running)
        c(self.waiting).set(s.waiting)
        if s.total_blocks:
            c(self.kv_usage).set(1.0 - s.free_blocks / s.total_blocks)
            c(self.kv_blocks).set(s.total_blocks)
        c(self.resident).set(1 if s.draft_resident else 0)
        c(self.decision_version).set(decision_version)
        c(self.fallback).set(1 if fallback else 0)
        if s.prefix_queries:
            c(self.prefix_queries).inc(s.prefix_queries)
            c(self.prefix_hits).inc(s.prefix_hits)
        if s.preempted:
            c(self.preemptions).inc(s.preempted)
        for m in s.memory_events:
            c(self.memory_events, m.kind).inc()
            c(self.memory_seconds, m.kind).observe(m.seconds)
        for sc in s.switch_costs:
            c(self.switch_seconds, sc.drafter).observe(sc.seconds)
        for name, rate in s.counterfactual.items():
            c(self.counterfactual, name).set(rate)
        if not (s.batch_size or s.prefill_tokens or s.num_tokens):
            return  # nothing computed
        c(self.steps).inc()
        c(self.step_time).observe(s.step_time)
        c(self.tokens).inc(s.num_tokens)
        c(self.prefill).inc(s.prefill_tokens)
        c(self.gamma).set(s.gamma)
        c(self.gamma_steps, str(s.gamma)).inc()
        if s.drafter is not None and s.proposed:
            d = s.drafter
            c(self.drafter_steps, d).inc()
            c(self.drafts, d).inc(s.num_drafts or s.batch_size)
            c(self.draft_tokens, d).inc(s.proposed)
            c(self.accepted, d).inc(s.accepted)
            for pos, n in enumerate(s.accepted_per_pos):
                c(self.accepted_pos, d, str(pos)).inc(n)

    def observe_final(
        self, final: FinishEvent | ErrorEvent, attempts: int, run: JobRun | None = None
    ) -> None:
        """A job's final write landed (``run``: its times, for the request-level vllm:* ones)."""
        outcome = final.finish_reason if isinstance(final, FinishEvent) else "error"
        self._c(self.jobs, outcome).inc()
        self._c(self.job_attempts).inc(max(1, attempts))
        if run is not None:
            self.vllm.observe_request(run, final)


def log_finished(job: JobRequest, final: FinishEvent | ErrorEvent, worker: str, attempts: int) -> None:
    """One line per finished job: tokens, TTFT, latency, finish reason, worker, attempts."""
    extra: dict[str, object] = {
        "job_id": job.job_id,
        "request_id": job.request_id,
        "worker": worker,
        "attempts": attempts,
    }
    if isinstance(final, ErrorEvent):
        extra |= {"finish_reason": "error", "error_code": final.code}
        log.info(
            "job %s failed: %s (%s) worker=%s attempts=%d request=%s",
            job.job_id,
            final.code,
            final.message,
            worker,
            attempts,
            job.request_id,
            extra=extra,
        )
        return
    ttft = "-" if final.ttft_s is None else f"{final.ttft_s:.3f}s"
    latency = "-" if final.latency_s is None else f"{final.latency_s:.3f}s"
    extra |= {
        "finish_reason": final.finish_reason,
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "ttft_s": final.ttft_s,
        "latency_s": final.latency_s,
    }
    log.info(
        "job %s finished: %s, %d prompt + %d completion tokens, ttft %s, latency %s, worker=%s "
        "attempts=%d request=%s",
        job.job_id,
        final.finish_reason,
        final.prompt_tokens,
        final.completion_tokens,
        ttft,
        latency,
        worker,
        attempts,
        job.request_id,
        extra=extra,
    )
