"""vLLM's metric families on a Nightjar worker, so vLLM's own Grafana dashboards work unchanged.

Beside the worker's ``nightjar:*`` metrics (worker/metrics.py), which stay as they are, the
worker exports the ``vllm:*`` families vLLM's engine does, with vLLM's labels: ``model_name``
(the served model name) and ``engine`` (the worker id, where vLLM puts its engine index). They
are observed from what the worker already has — each engine step's ``StepStats`` and each
job's final write with its ``JobRun``'s times — and mean what vLLM's mean:

- per step: ``num_requests_running`` / ``_waiting`` (``_waiting_by_reason``: all "capacity"),
  ``kv_cache_usage_perc`` (and the older ``gpu_cache_usage_perc`` that vLLM's classic
  dashboard reads), ``num_preemptions``, ``prefix_cache_queries`` / ``_hits``,
  ``generation_tokens``, ``iteration_tokens_total`` (prompt + generated tokens a step), and
  speculation: ``spec_decode_num_drafts`` (a sequence that drafted, a step),
  ``_num_draft_tokens``, ``_num_accepted_tokens``, ``_num_accepted_tokens_per_pos``;
- per finished request: ``request_success{finished_reason}`` (stop, length, abort, error),
  ``prompt_tokens`` and ``prompt_tokens_by_source`` (local_compute / local_cache_hit),
  ``time_to_first_token_seconds``, ``inter_token_latency_seconds`` and
  ``time_per_output_token_seconds`` (one sample per step's output: several tokens under
  speculation), ``request_time_per_output_token_seconds``, ``e2e_request_latency_seconds``,
  ``request_queue_time_seconds`` (submit to the worker taking it), ``request_prefill_time``,
  ``_decode_time``, ``_inference_time``, ``request_prompt_tokens``,
  ``request_generation_tokens``, ``request_max_num_generation_tokens``,
  ``request_params_max_tokens``, ``request_params_n``.

What vLLM has and Nightjar has not — a multimodal cache, an external (connector) prefix
cache, swapped requests — is not exported, as vLLM does not export it unless configured.
Latencies start at the gateway's submit (``JobRequest.created_at``), vLLM's arrival time.
"""

from __future__ import annotations

from typing import Any

from shared.control import StepStats
from shared.metrics import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    TTFT_BUCKETS,
    VLLM_PREFIX,
    MetricSet,
    buckets_1_2_5,
)
from shared.schemas import ErrorEvent, FinishEvent, FinishReason
from worker.job_run import JobRun

LABELS = ("model_name", "engine")
# Ours -> vLLM's finish_reason label.
REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
    FinishReason.ERROR: "error",
}
ITERATION_BUCKETS = tuple(float(2**i) for i in range(15))  # 1 .. 16384 tokens a step
MAX_LEN = 1 << 20  # the request-length buckets' top when the context is not known


class VllmMetrics(MetricSet):
    prefix = VLLM_PREFIX

    def __init__(self, model: str, engine: str, max_model_len: int = 0) -> None:
        super().__init__()
        self.model, self.engine = model, engine
        g, c, h = self.gauge, self.counter, self.histogram
        lengths = buckets_1_2_5(max_model_len or MAX_LEN)
        self.running = g("num_requests_running", "Requests in the engine's running batch.", LABELS)
        self.waiting = g("num_requests_waiting", "Requests waiting to be scheduled.", LABELS)
        self.waiting_by_reason = g(
            "num_requests_waiting_by_reason", "Waiting requests by why they wait.", (*LABELS, "reason")
        )
        self.kv = g("kv_cache_usage_perc", "KV-cache usage, 0..1 (1 = full).", LABELS)
        self.gpu_kv = g("gpu_cache_usage_perc", "KV-cache usage, 0..1 (vLLM's older name).", LABELS)
        self.preemptions = c("num_preemptions", "Preempted requests.", LABELS)
        self.prefix_queries = c(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", LABELS
        )
        self.prefix_hits = c("prefix_cache_hits", "Prompt tokens found in the prefix cache.", LABELS)
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens of finished requests.", LABELS)
        self.prompt_by_source = c(
            "prompt_tokens_by_source", "Prompt tokens by where they came from.", (*LABELS, "source")
        )
        self.generation_tokens = c("generation_tokens", "Generated tokens.", LABELS)
        self.iteration = h(
            "iteration_tokens_total",
            "Tokens (prompt + generated) per engine step.",
            LABELS,
            ITERATION_BUCKETS,
        )
        self.success = c(
            "request_success", "Finished requests by finish reason.", (*LABELS, "finished_reason")
        )
        self.drafts = c("spec_decode_num_drafts", "Speculative drafts (a drafting sequence, a step).", LABELS)
        self.draft_tokens = c("spec_decode_num_draft_tokens", "Draft tokens proposed.", LABELS)
        self.accepted = c("spec_decode_num_accepted_tokens", "Draft tokens accepted.", LABELS)
        self.accepted_pos = c(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position.",
            (*LABELS, "position"),
        )
        self.ttft = h("time_to_first_token_seconds", "Arrival to the first token.", LABELS, TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Between consecutive outputs.", LABELS, ITL_BUCKETS)
        self.tpot = h(
            "time_per_output_token_seconds", "Between consecutive outputs (older name).", LABELS, ITL_BUCKETS
        )
        self.request_tpot = h(
            "request_time_per_output_token_seconds",
            "A request's mean time a token after the first.",
            LABELS,
            ITL_BUCKETS,
        )
        self.e2e = h("e2e_request_latency_seconds", "Arrival to the last token.", LABELS, E2E_BUCKETS)
        self.queue = h(
            "request_queue_time_seconds", "Arrival to the worker taking the request.", LABELS, E2E_BUCKETS
        )
        self.prefill = h("request_prefill_time_seconds", "Taken to the first token.", LABELS, E2E_BUCKETS)
        self.decode = h("request_decode_time_seconds", "First token to the last.", LABELS, E2E_BUCKETS)
        self.inference = h("request_inference_time_seconds", "Taken to the last token.", LABELS, E2E_BUCKETS)
        self.prompt_len = h("request_prompt_tokens", "Prompt tokens of a request.", LABELS, lengths)
        self.gen_len = h("request_generation_tokens", "Generated tokens of a request.", LABELS, lengths)
        self.max_gen = h(
            "request_max_num_generation_tokens",
            "Most generated tokens of a request's sequences.",
            LABELS,
            lengths,
        )
        self.max_tokens = h("request_params_max_tokens", "A request's max_tokens.", LABELS, lengths)
        self.n = h(
            "request_params_n", "A request's n (one job a choice: 1).", LABELS, (1.0, 2.0, 5.0, 10.0, 20.0)
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        for metric in (self.running, self.waiting, self.kv, self.gpu_kv, self.preemptions,
                       self.prefix_queries, self.prefix_hits, self.prompt_tokens, self.generation_tokens,
                       self.drafts, self.draft_tokens, self.accepted):  # fmt: skip
            self._c(metric)  # exported (at 0) from the start: dashboards' variables and rates begin
        for reason in ("capacity", "deferred"):
            self._c(self.waiting_by_reason, reason)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self._c(self.prompt_by_source, source)
        for reason in REASONS.values():
            self._c(self.success, reason)

    def _c(self, metric: Any, *extra: str) -> Any:
        key = (id(metric), extra)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model, self.engine, *extra)
        return child

    def observe_idle(self) -> None:
        for metric in (self.running, self.waiting):
            self._c(metric).set(0)
        self._c(self.waiting_by_reason, "capacity").set(0)

    def observe_step(self, s: StepStats) -> None:
        c = self._c
        c(self.running).set(s.running)
        c(self.waiting).set(s.waiting)
        c(self.waiting_by_reason, "capacity").set(s.waiting)
        if s.total_blocks:
            used = 1.0 - s.free_blocks / s.total_blocks
            c(self.kv).set(used)
            c(self.gpu_kv).set(used)
        if s.preempted:
            c(self.preemptions).inc(s.preempted)
        if s.prefix_queries:
            c(self.prefix_queries).inc(s.prefix_queries)
            c(self.prefix_hits).inc(s.prefix_hits)
        if not (s.batch_size or s.prefill_tokens or s.num_tokens):
            return
        c(self.generation_tokens).inc(s.num_tokens)
        c(self.iteration).observe(s.prefill_tokens + s.num_tokens)
        if s.drafter is not None and s.proposed:
            c(self.drafts).inc(s.num_drafts or s.batch_size)
            c(self.draft_tokens).inc(s.proposed)
            c(self.accepted).inc(s.accepted)
            for pos, n in enumerate(s.accepted_per_pos):
                c(self.accepted_pos, str(pos)).inc(n)

    def observe_request(self, run: JobRun, final: FinishEvent | ErrorEvent) -> None:
        """A job's final write landed: its request-level numbers."""
        c = self._c
        reason = "error" if isinstance(final, ErrorEvent) else REASONS.get(final.finish_reason, "stop")
        c(self.success, reason).inc()
        prompt, output = len(run.prompt_ids), len(run.output)
        cached = min(run.cached_prompt_tokens, prompt)
        c(self.prompt_tokens).inc(prompt)
        c(self.prompt_by_source, "local_compute").inc(prompt - cached)
        c(self.prompt_by_source, "local_cache_hit").inc(cached)
        c(self.prompt_len).observe(prompt)
        c(self.gen_len).observe(output)
        c(self.max_gen).observe(output)
        c(self.max_tokens).observe(run.job.params.max_tokens)
        c(self.n).observe(1)
        arrival = run.job.created_at
        c(self.queue).observe(max(0.0, run.started_at - arrival))
        first, last = run.first_token_at, run.last_token_at
        if first is None or last is None:
            return
        c(self.ttft).observe(max(0.0, first - arrival))
        c(self.e2e).observe(max(0.0, last - arrival))
        c(self.prefill).observe(max(0.0, first - run.started_at))
        c(self.decode).observe(max(0.0, last - first))
        c(self.inference).observe(max(0.0, last - run.started_at))
        c(self.request_tpot).observe((last - first) / (output - 1) if output > 1 else 0.0)
        itl, tpot = c(self.itl), c(self.tpot)
        for gap in run.gaps:
            itl.observe(gap)
            tpot.observe(gap)
