"""What logprobs cost in the engine (docs/api.md, "Logprobs").

- ``decode``: greedy decoding of the same prompts, all in one batch, with no logprobs, with
  the chosen token's (k = 0) and with the top 5 / 20, at γ = 0 and γ = 4 (n-gram drafter):
  tokens per second without, and each run's speed as a ratio of it;
- ``prompt``: lm-eval-harness's loglikelihood shape (echo, max_tokens 1): the same prompts
  scored with prompt logprobs against plain one-token requests, once, and twice (the plain
  second round is served from the prefix cache and stored logits, which prompt logprobs skip).

Every configuration runs on a fresh engine, interleaved with the others, ``--tries`` times;
the best time of each counts (the machine is shared).

    .venv/bin/python -m benchmarks.logprobs_bench --model models/nj-target
"""

from __future__ import annotations

import argparse
import time

import torch

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

PROMPTS = ["Once upon a time", "def fibonacci(n):", "The weather today", "A movie review:"] * 4
Config = tuple[SamplingParams, int, int]  # params, γ, rounds


def once(model: str, config: Config, prompts: list[list[int]]) -> float:
    """Seconds to finish every prompt (``rounds`` times, one after the other)."""
    params, gamma, rounds = config
    engine = load_engine(model, num_blocks=2048)
    apply_decision(
        engine, Decision(version=1, policy="bench", gamma_table=[(ALL_BATCHES, gamma)], drafter="ngram")
    )
    t0 = time.perf_counter()
    for r in range(rounds):
        for i, p in enumerate(prompts):
            engine.add_request(EngineRequest(f"{r}-{i}", p, params))
        while engine.has_unfinished():
            engine.step()
    return time.perf_counter() - t0


def best(model: str, configs: list[Config], prompts: list[list[int]], tries: int) -> list[float]:
    times = [float("inf")] * len(configs)
    for _ in range(tries):
        for i, c in enumerate(configs):
            times[i] = min(times[i], once(model, c, prompts))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="models/nj-target")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tries", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = load_engine(args.model, num_blocks=64).tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    once(args.model, (SamplingParams(max_tokens=4), 0, 1), prompts)  # warm up
    print(f"decode: {len(prompts)} prompts x {args.tokens} tokens, greedy, one batch, best of {args.tries}")
    ks = [None, 0, 5, 20]
    for gamma in (0, 4):
        configs = [
            (SamplingParams(max_tokens=args.tokens, ignore_eos=True, logprobs=k), gamma, 1) for k in ks
        ]
        base, *rest = best(args.model, configs, prompts, args.tries)
        cells = [f"none {len(prompts) * args.tokens / base:8.1f} tok/s"]
        cells += [f"k={k}: {base / t:.2f}x" for k, t in zip(ks[1:], rest, strict=True)]
        print(f"  gamma={gamma}: " + "  ".join(cells))
    long = [tok(p * 12)["input_ids"] for p in PROMPTS]
    n = sum(len(p) for p in long)
    print(f"prompt: {len(long)} prompts, {n} tokens, max_tokens 1")
    plain, scored = SamplingParams(max_tokens=1), SamplingParams(max_tokens=1, logprobs=1, prompt_logprobs=1)
    for rounds in (1, 2):
        a, b = best(args.model, [(plain, 0, rounds), (scored, 0, rounds)], long, args.tries)
        print(
            f"  {rounds} round(s): plain {rounds * n / a:8.1f} prompt tok/s, "
            f"with prompt logprobs {rounds * n / b:8.1f} ({a / b:.2f}x)"
        )


if __name__ == "__main__":
    main()
