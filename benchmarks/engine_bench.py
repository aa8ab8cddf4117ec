"""Our engine against transformers' generate (static batching, left padding) on ShareGPT.

Same model, same chat-templated prompts, same output length (EOS ignored), in one run:
output tokens/s, TTFT and TPOT at each concurrency, then the decode step time of the engine
against a bare forward (our runner alone, and transformers with its cache).

    python -m benchmarks.engine_bench --model models/smollm2-135m-instruct

Timings on a shared machine are noisy: the script interleaves what it compares and reports
medians, but say how loaded the machine was when quoting it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LogitsProcessor, LogitsProcessorList

from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.engine.model_runner import ForwardItem

# ../shared/data beside the checkout (the project's data, never copied in).
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DEFAULT_PROMPTS = str(DATA / "workloads" / "sharegpt_v3_filtered_1000.json")
TABLE_HEAD = (
    "| concurrency | prompts | ours tok/s | HF tok/s | ours/HF | TTFT s ours | TTFT s HF "
    "| TPOT ms ours | TPOT ms HF |\n|---|---|---|---|---|---|---|---|---|"
)


@dataclass
class Result:
    tokens_per_s: float
    ttft_s: float  # mean time to first token
    tpot_s: float  # mean time per output token after the first


def load_prompts(path: str, tokenizer: Any, count: int, max_tokens: int) -> list[list[int]]:
    with open(path, encoding="utf-8") as f:
        rows = json.load(f)
    prompts = []
    for row in rows:
        text = row["conversations"][0]["value"]
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if len(ids) <= max_tokens:
            prompts.append(ids)
        if len(prompts) == count:
            return prompts
    raise ValueError(f"only {len(prompts)} prompts of at most {max_tokens} tokens in {path}")


def median_result(results: list[Result]) -> Result:
    return Result(
        *(statistics.median(getattr(r, f) for r in results) for f in ("tokens_per_s", "ttft_s", "tpot_s"))
    )


def fresh_engine(engine: LLMEngine) -> LLMEngine:
    """Same weights, empty cache: no prefix hits carried over from an earlier run."""
    return LLMEngine(engine.runner, engine.config, engine.eos_token_ids)


def run_ours(engine: LLMEngine, prompts: list[list[int]], concurrency: int, new: int) -> Result:
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    queue = list(enumerate(prompts))
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    t0 = time.perf_counter()
    while queue or engine.has_unfinished():
        while queue and len(start) - len(done) < concurrency:
            i, ids = queue.pop(0)
            start[str(i)] = time.perf_counter()
            engine.add_request(EngineRequest(str(i), ids, params))
        outputs = engine.step().outputs
        now = time.perf_counter()
        for out in outputs:
            if out.new_token_ids:
                first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = now
    wall = time.perf_counter() - t0
    return Result(
        len(prompts) * new / wall,
        statistics.mean(first[r] - start[r] for r in start),
        statistics.mean((done[r] - first[r]) / (new - 1) for r in start),
    )


class _FirstCall(LogitsProcessor):
    """Notes when generate has its first logits: the end of the prefill."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.at is None:
            self.at = time.perf_counter()
        return scores


def run_hf(model: Any, prompts: list[list[int]], concurrency: int, new: int, pad_id: int) -> Result:
    model.generation_config.eos_token_id = None  # run the full length, like ignore_eos
    model.generation_config.pad_token_id = pad_id
    ttfts, tpots = [], []
    t0 = time.perf_counter()
    for b in range(0, len(prompts), concurrency):
        batch = prompts[b : b + concurrency]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        probe = _FirstCall()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                do_sample=False,
                logits_processor=LogitsProcessorList([probe]),
            )
        end = time.perf_counter()
        assert probe.at is not None
        ttfts += [probe.at - t] * len(batch)
        tpots += [(end - probe.at) / (new - 1)] * len(batch)
    wall = time.perf_counter() - t0
    return Result(len(prompts) * new / wall, statistics.mean(ttfts), statistics.mean(tpots))


def step_overhead(
    engine: LLMEngine, model: Any, prompts: list[list[int]], batch: int, reps: int
) -> tuple[float, float, float]:
    """Median ms of (engine decode step, our bare forward, transformers forward with its
    cache) at ``batch`` sequences, measured interleaved."""
    engine = fresh_engine(engine)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    for i in range(batch):
        engine.add_request(EngineRequest(f"s{i}", prompts[i % len(prompts)], params))
    while any(s.prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    ctx = len(prompts[0])
    items = []
    for i in range(batch):
        assert engine.blocks.allocate(f"bare{i}", 0, ctx + 1)
        items.append(ForwardItem([5], ctx, engine.blocks.table(f"bare{i}"), 1))
    cache = DynamicCache()
    with torch.inference_mode():
        model(torch.randint(0, 1000, (batch, ctx)), cache=cache, use_cache=True)
    x = torch.full((batch, 1), 5)
    steps, bare, hf = [], [], []
    for _ in range(reps):
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
        t = time.perf_counter()
        engine.runner.run(items)
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        with torch.inference_mode():
            model(x, cache=cache, use_cache=True)
        cache.crop(-1)
        hf.append(time.perf_counter() - t)
    return tuple(statistics.median(v) * 1e3 for v in (steps, bare, hf))  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--min-prompts", type=int, default=4, help="prompts per level at least")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-prompt-tokens", type=int, default=256)
    ap.add_argument("--max-batched-tokens", type=int, default=1024)
    ap.add_argument("--overhead-batches", type=int, nargs="*", default=[1, 32])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs per level (medians)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    if not model_dir.exists():
        raise SystemExit(f"{model_dir} does not exist (SmolLM2: run `python -m training smollm2`)")
    engine = load_engine(model_dir, max_num_batched_tokens=args.max_batched_tokens, max_num_seqs=256)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = engine.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(engine.eos_token_ids)
    count = max(max(args.concurrency), args.min_prompts)
    prompts = load_prompts(args.prompts, tok, count, args.max_prompt_tokens)
    # Warm-up: first-touch of the KV pages and of both models' buffers stays out of the table.
    run_ours(fresh_engine(engine), prompts[:1], 1, 4)
    run_hf(hf, prompts[:1], 1, 4, pad_id)
    print(f"model {model_dir} · {args.threads} threads · {os.cpu_count()} CPUs · load {os.getloadavg()}")
    print(f"median of {args.rounds} alternating rounds per level")
    print(f"{args.new_tokens} new tokens, EOS ignored; chat prompts ≤ {args.max_prompt_tokens} tokens\n")
    print(TABLE_HEAD)
    for c in args.concurrency:
        batch = prompts[: max(c, args.min_prompts)]
        # Alternate the two so that load from other processes hits both alike.
        rounds = [
            (
                run_ours(fresh_engine(engine), batch, c, args.new_tokens),
                run_hf(hf, batch, c, args.new_tokens, pad_id),
            )
            for _ in range(args.rounds)
        ]
        ours, ref = (median_result([r[k] for r in rounds]) for k in (0, 1))
        print(
            f"| {c} | {len(batch)} | {ours.tokens_per_s:.1f} | {ref.tokens_per_s:.1f} | "
            f"{ours.tokens_per_s / ref.tokens_per_s:.2f} | {ours.ttft_s:.2f} | {ref.ttft_s:.2f} | "
            f"{ours.tpot_s * 1e3:.1f} | {ref.tpot_s * 1e3:.1f} |",
            flush=True,
        )
    if args.overhead_batches:
        print(
            "\n| batch | engine decode step ms | our bare forward ms | step / bare | HF forward (cache) ms |"
        )
        print("|---|---|---|---|---|")
    for b in args.overhead_batches:
        step, bare, hf_ms = step_overhead(engine, hf, prompts, b, args.reps)
        print(f"| {b} | {step:.1f} | {bare:.1f} | {step / bare:.2f} | {hf_ms:.1f} |", flush=True)
    print(f"\nload after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
