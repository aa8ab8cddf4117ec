"""The sampling work alone of a seeded (keyed) against an unseeded step, on the target's own
rows: ``verify_batch`` of γ + 1 rows a sequence and one drafter's draw a sequence, alternating,
medians (``benchmarks.seeded_bench --cost-batches``, which prints the table)."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from shared.schemas import SamplingParams
from worker.engine.records import Candidate, Drafted
from worker.engine.sampler import draw
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence
from worker.engine.spec.verify import verify_batch

SCHEMES = ("keyed", "rejection")  # every request seeded (keyed draws), every request unseeded


def _target_rows(target: Path, prompts: list[list[int]]) -> torch.Tensor:
    """The target's logits at every position of the prompts (transformers), ``[N, V]``."""
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.cat([hf(torch.tensor([p])).logits[0] for p in prompts])


def _candidates(rows: torch.Tensor, batch: int, gamma: int, keyed: bool) -> list[Candidate]:
    """``batch`` verifications of γ drafts (each row's argmax; q its softmax at 0.9 of the
    logits' scale) on consecutive rows, as the engine hands them to ``verify_batch``."""
    out = []
    for b in range(batch):
        r = rows[b * (gamma + 1) : (b + 1) * (gamma + 1)]
        params = SamplingParams(temperature=1.0, seed=b if keyed else None)
        drafts = r[:gamma].argmax(-1).tolist()
        seq = Sequence(str(b), [1], params, token_ids=[1, *drafts])
        drafted = Drafted(1, drafts, torch.softmax(0.9 * r[:gamma], -1), gamma)
        out.append(Candidate(Scheduled(seq, gamma + 1), r, r.argmax(-1).tolist(), drafted))
    return out


def sampling_cost(target: Path, prompts: list[list[int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The sampling work of a step on the target's own rows: verification and a draft draw."""
    rows = _target_rows(target, prompts)
    out = []
    for batch in args.cost_batches:
        for gamma in (2, 4):
            verify = {s: _candidates(rows, batch, gamma, s == "keyed") for s in SCHEMES}
            q = torch.softmax(rows[:batch], -1)
            params = {
                s: [SamplingParams(temperature=1.0, seed=i if s == "keyed" else None) for i in range(batch)]
                for s in SCHEMES
            }
            times: dict[str, list[float]] = {f"{k}-{s}": [] for k in ("verify", "draw") for s in SCHEMES}
            for _ in range(args.rounds * 5):
                for s in SCHEMES:
                    gens: list[torch.Generator | None] = [
                        torch.Generator().manual_seed(i) for i in range(batch)
                    ]
                    t0 = time.perf_counter()
                    verify_batch(verify[s])
                    t1 = time.perf_counter()
                    draw(q, params[s], list(range(batch)), gens)
                    t2 = time.perf_counter()
                    times[f"verify-{s}"].append(t1 - t0)
                    times[f"draw-{s}"].append(t2 - t1)
            med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            out.append({"batch": batch, "gamma": gamma, **med})
            print(json.dumps(out[-1]), flush=True)
    return out
