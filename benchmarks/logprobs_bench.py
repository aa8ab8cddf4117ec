"""What logprobs cost in the engine (docs/api.md, "Logprobs").

- ``decode``: greedy decoding of the same prompts, all in one batch, with no logprobs, with
  the chosen token's (k = 0) and with the top 5 / 20, at γ = 0 and γ = 4 (n-gram drafter):
  tokens per second side by side, as a ratio of the run without;
- ``prompt``: lm-eval-harness's loglikelihood shape (echo, max_tokens 1): the same prompts
  scored with prompt logprobs against plain one-token requests, once, and twice (the plain
  second round is served from the prefix cache and stored logits, which prompt logprobs skip).

    .venv/bin/python -m benchmarks.logprobs_bench --model models/nj-target
"""

from __future__ import annotations

import argparse
import time

import torch

from shared.schemas import ALL_BATCHES, Decision, SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine

TRIES = 3
PROMPTS = ["Once upon a time", "def fibonacci(n):", "The weather today", "A movie review:"] * 4


def run(model: str, params: SamplingParams, gamma: int, prompts: list[list[int]], rounds: int = 1) -> float:
    """Seconds to finish every prompt (``rounds`` times, one after the other) on a fresh
    engine: the best of ``TRIES`` (the machine is shared)."""
    best = float("inf")
    for _ in range(TRIES):
        engine = load_engine(model, num_blocks=2048)
        decision = Decision(version=1, policy="bench", gamma_table=[(ALL_BATCHES, gamma)], drafter="ngram")
        engine.apply_decision(decision)
        t0 = time.perf_counter()
        for r in range(rounds):
            for i, p in enumerate(prompts):
                engine.add_request(EngineRequest(f"{r}-{i}", p, params))
            while engine.has_unfinished():
                engine.step()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/nj-target")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = load_engine(args.model, num_blocks=64).tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    long = [tok(p * 12)["input_ids"] for p in PROMPTS]
    run(args.model, SamplingParams(max_tokens=4), 0, prompts)  # warm up
    print(f"decode: {len(prompts)} prompts x {args.tokens} tokens, greedy, one batch")
    for gamma in (0, 4):
        base = run(args.model, SamplingParams(max_tokens=args.tokens, ignore_eos=True), gamma, prompts)
        cells = [f"none {len(prompts) * args.tokens / base:8.1f} tok/s"]
        for k in (0, 5, 20):
            p = SamplingParams(max_tokens=args.tokens, ignore_eos=True, logprobs=k)
            cells.append(f"k={k}: {base / run(args.model, p, gamma, prompts):.2f}x")
        print(f"  gamma={gamma}: " + "  ".join(cells))
    n = sum(len(p) for p in long)
    print(f"prompt: {len(long)} prompts, {n} tokens, max_tokens 1")
    for rounds in (1, 2):
        plain = run(args.model, SamplingParams(max_tokens=1), 0, long, rounds)
        scored = run(args.model, SamplingParams(max_tokens=1, logprobs=1, prompt_logprobs=1), 0, long, rounds)
        print(
            f"  {rounds} round(s): plain {rounds * n / plain:8.1f} prompt tok/s, "
            f"with prompt logprobs {rounds * n / scored:8.1f} ({plain / scored:.2f}x)"
        )


if __name__ == "__main__":
    main()
