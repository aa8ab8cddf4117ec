"""What the logits cache saves on an exact repeat of a prompt (RAKV-ASD's reuse).

An exact repeat finds every prompt token's KV in the prefix cache. Without stored logits the
engine still runs one forward for the last prompt token (its logits choose the first output
token); with them (``EngineConfig.logits_cache_size`` > 0) it skips that forward. This times,
in one engine step, the first token of: a cold prompt (full prefill), an exact repeat with
stored logits, and an exact repeat without (``logits_cache_size=0``), at batch 1, interleaved.

    python -m benchmarks.repeat_bench --model models/nj-target --lengths 32,128,512
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine

ONE = SamplingParams(max_tokens=1, ignore_eos=True)


def first_token_s(engine: LLMEngine, request_id: str, prompt: list[int]) -> float:
    """Seconds of the one step that admits ``prompt`` and emits its first token."""
    engine.add_request(EngineRequest(request_id, prompt, ONE))
    t0 = time.perf_counter()
    result = engine.step()
    seconds = time.perf_counter() - t0
    (out,) = result.outputs
    assert out.finished and len(out.new_token_ids) == 1 and not engine.has_unfinished()
    return seconds


def measure(model: str, length: int, repeats: int, seed: int) -> dict[str, float]:
    engines = {
        "stored": load_engine(model, ngram=False, num_blocks=4096),
        "recompute": load_engine(model, ngram=False, num_blocks=4096, logits_cache_size=0),
    }
    vocab = engines["stored"].runner.config.vocab_size
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"cold": [], "stored": [], "recompute": []}
    for i in range(repeats):
        prompt = [rng.randrange(3, vocab) for _ in range(length)]
        for name, engine in engines.items():
            cold = first_token_s(engine, f"c{i}", prompt)
            if name == "stored":
                times["cold"].append(cold)
            times[name].append(first_token_s(engine, f"r{i}", prompt))
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.repeat_bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="models/nj-target")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[32, 128, 512])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| prompt tokens | cold prefill ms | repeat, stored logits ms | repeat, recomputed ms | saved ms |")
    print("|---|---|---|---|---|")
    for length in args.lengths:
        m = measure(args.model, length, args.repeats, args.seed)
        ms = {k: 1000 * v for k, v in m.items()}
        print(
            f"| {length} | {ms['cold']:.2f} | {ms['stored']:.2f} | {ms['recompute']:.2f} "
            f"| {ms['recompute'] - ms['stored']:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
