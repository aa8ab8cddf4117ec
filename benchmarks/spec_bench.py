"""Speculative decoding drafter by drafter: tokens per verification and speedup over γ = 0.

For each target and its drafters (the model drafters named, plus "ngram"), at each batch
size, the engine generates ``--max-tokens`` greedy tokens (EOS ignored) for the same
workload prompts under a static decision: γ = 0, then every drafter at every γ. Rounds
alternate the configurations so a noisy machine slows them alike; times are medians over
rounds. Prefix caching is off, so every configuration pays the same prefills. Each
speculative output is checked against the γ = 0 output (greedy must be exact).

Each speculative configuration runs with counterfactual scoring of the other drafters off
and on (``--scoring``: the engine's ``counterfactual_every``), so its cost shows. Reported per
configuration: tokens per verification (accepted + 1 per verified sequence), per-token
acceptance (accepted / judged drafts), output tokens/s and speedup over γ = 0 for the whole
generation (prefill included) and for the decode steps alone (steps that prefilled nothing,
catch-up and scoring included), the share of step time spent drafting and scoring, and the
catch-up at the first speculative step. Then, per target, one offload/reload cycle of the
drafters in the middle of a batch (seconds of each weight move and of the KV pool resize).

    python -m benchmarks.spec_bench --pair models/nj-target=models/nj-draft-prose,models/nj-draft-code \\
        --workload /work/shared/data/workloads/spec_bench_question.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from benchmarks.load.contents import RAW, SOURCES, ContentLibrary
from benchmarks.load.regime import DEFAULT_DATA
from benchmarks.load.workloads import WorkloadItem, load_workload
from shared.control import ALL_BATCHES, Decision, MemoryEvent
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest, StepStats
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

_versions = itertools.count(1)
DATA_DIR = str(DEFAULT_DATA)
HEAD = (
    "| target | drafter | batch | γ | scoring | tokens / verify | acceptance | tok/s | speedup | "
    "decode speedup | draft % | counterfactual % | catch-up ms | exact |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass
class Measured:
    target: str
    drafter: str
    batch: int
    gamma: int
    scoring: int  # counterfactual_every: score the other drafters every k-th step (0: never)
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    stats: list[StepStats] = field(default_factory=list)
    exact: bool = True

    def total(self, name: str) -> float:
        return float(sum(getattr(s, name) for s in self.stats))

    def tokens_per_s(self) -> float:
        return self.tokens / statistics.median(self.seconds)

    def decode_tokens_per_s(self) -> float:
        """Over the steps that prefilled nothing (catch-ups and scoring included)."""
        decode = [s for s in self.stats if s.prefill_tokens == 0 and s.batch_size > 0]
        return sum(s.num_tokens for s in decode) / max(sum(s.step_time for s in decode), 1e-9)

    def row(self, base: Measured) -> dict[str, Any]:
        spec = [s for s in self.stats if s.gamma > 0]
        verifies = sum(s.batch_size for s in spec)
        # The engine reports the active drafter's realised acceptance (accepted / judged drafts)
        # per step; weigh steps by the sequences they verified.
        rated = [(s.counterfactual[s.drafter], s.batch_size) for s in spec if s.drafter in s.counterfactual]
        steps = self.total("step_time") or 1.0
        return {
            "target": self.target,
            "drafter": self.drafter,
            "batch": self.batch,
            "gamma": self.gamma,
            "scoring": self.scoring,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "exact": self.exact,
            "tokens_per_verify": (self.total("accepted") + verifies) / verifies if verifies else 1.0,
            "acceptance": sum(a * b for a, b in rated) / sum(b for _, b in rated) if rated else None,
            "tokens_per_s": self.tokens_per_s(),
            "speedup": self.tokens_per_s() / base.tokens_per_s(),
            "decode_speedup": self.decode_tokens_per_s() / base.decode_tokens_per_s(),
            "draft_share": self.total("draft_time") / steps,
            "counterfactual_share": self.total("counterfactual_time") / steps,
            "catch_up_ms": 1e3
            * sum(e.seconds for s in self.stats for e in s.switch_costs)
            / len(self.seconds),
            "counterfactual": _mean_rates(spec),
        }


def _mean_rates(stats: list[StepStats]) -> dict[str, float]:
    """Each drafter's mean acceptance over the steps that scored it."""
    seen: dict[str, list[float]] = {}
    for s in stats:
        for name, rate in s.counterfactual.items():
            seen.setdefault(name, []).append(rate)
    return {name: statistics.fmean(v) for name, v in seen.items()}


def workload_items(workloads: list[str], data_dir: str, seed: int) -> list[WorkloadItem]:
    """A workload file's prompts, or a named content source's (``chat``, ``code``, a Spec-Bench
    category: benchmarks/load/contents.py) when no such file exists."""
    library = ContentLibrary(data_dir, seed)
    items: list[WorkloadItem] = []
    for w in workloads:
        items += load_workload(w).items if Path(w).exists() or w not in SOURCES else library.get(w)
    return items


def prompts_for(
    model: Path, workloads: list[str], count: int, max_prompt: int, seed: int, data_dir: str = DATA_DIR
) -> list[list[int]]:
    """Seeded sample of workload prompts, chat-templated when the tokenizer has a template
    (raw text sources, such as ``code``, go in as they are, as the completions route sends them)."""
    tok = AutoTokenizer.from_pretrained(str(model))
    items = workload_items(workloads, data_dir, seed)
    random.Random(seed).shuffle(items)
    out: list[list[int]] = []
    for it in items:
        if tok.chat_template and it.endpoint != RAW:
            text = tok.apply_chat_template(
                [{"role": "user", "content": it.prompt}], add_generation_prompt=True, tokenize=False
            )
            ids = tok(str(text), add_special_tokens=False)["input_ids"]
        else:
            ids = tok(it.prompt)["input_ids"]
        if 0 < len(ids) <= max_prompt:
            out.append(list(ids))
        if len(out) == count:
            break
    return out


def generate(
    engine: LLMEngine, prompts: list[list[int]], batch: int, params: SamplingParams
) -> tuple[float, list[list[int]], list[StepStats]]:
    """All prompts, ``batch`` at a time; returns seconds, outputs and step stats."""
    outputs: dict[str, list[int]] = {}
    stats: list[StepStats] = []
    t0 = time.perf_counter()
    for g in range(0, len(prompts), batch):
        for i in range(g, min(g + batch, len(prompts))):
            engine.add_request(EngineRequest(str(i), prompts[i], params))
        while engine.has_unfinished():
            result = engine.step()
            stats.append(result.stats)
            for out in result.outputs:
                outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    return time.perf_counter() - t0, [outputs[str(i)] for i in range(len(prompts))], stats


def decide(engine: LLMEngine, gamma: int, drafter: str | None, offload: bool = False) -> None:
    table = [(ALL_BATCHES, gamma)]
    apply_decision(
        engine,
        Decision(
            version=next(_versions), policy="spec-bench", gamma_table=table, drafter=drafter, offload=offload
        ),
    )


def bench_pair(
    target: Path, drafters: list[Path], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    # A pool for the largest batch with room to spare (the default budget would be 1 GiB of KV).
    per_seq = -(-(args.max_prompt_tokens + args.max_tokens + max(args.gammas) + 1) // 16)
    blocks = 3 * max(args.batches) * per_seq // 2 + 8
    engine = load_engine(
        target,
        drafters=drafters,
        enable_prefix_caching=False,
        max_num_seqs=max(args.batches),
        num_blocks=blocks,
    )
    names = engine.drafter_names
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    all_prompts = prompts_for(
        target, args.workload, max(args.batches), args.max_prompt_tokens, args.seed, args.data
    )
    rows = []
    for batch in args.batches:
        prompts = all_prompts[: max(batch, args.batch1_prompts if batch == 1 else batch)]
        configs = [Measured(target.name, "-", batch, 0, 0)]
        configs += [
            Measured(target.name, n, batch, g, k) for n in names for g in args.gammas for k in args.scoring
        ]
        decide(engine, 0, None)
        generate(engine, prompts[:batch], batch, params)  # warm-up
        reference: list[list[int]] | None = None
        for _ in range(args.rounds):
            for m in configs:
                decide(engine, m.gamma, None if m.drafter == "-" else m.drafter)
                if engine.spec.pool is not None:
                    engine.spec.pool.every = m.scoring
                seconds, outs, stats = generate(engine, prompts, batch, params)
                reference = reference if reference is not None else outs
                m.seconds.append(seconds)
                m.tokens, m.exact = sum(len(o) for o in outs), m.exact and outs == reference
                m.stats += stats
        rows += [m.row(configs[0]) for m in configs]
    return rows, memory_cycle(engine, all_prompts, max(args.batches), params)


def memory_cycle(
    engine: LLMEngine, prompts: list[list[int]], batch: int, params: SamplingParams
) -> dict[str, Any]:
    """Offload the drafters after a few decode steps of a batch, reload a few steps later."""
    for i, p in enumerate(prompts[:batch]):
        engine.add_request(EngineRequest(f"m{i}", p, params))
    events: list[MemoryEvent] = []
    step = 0
    while engine.has_unfinished():
        decide(engine, 0, None, offload=4 <= step < 10)
        events += engine.step().stats.memory_events
        step += 1
    return {"batch": batch, "events": [e.model_dump() for e in events]}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [HEAD]
    for r in rows:
        acc = "–" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        scoring = "–" if r["gamma"] == 0 else "off" if r["scoring"] == 0 else f"every {r['scoring']}"
        cells = [
            r["target"], r["drafter"], r["batch"], r["gamma"], scoring, f"{r['tokens_per_verify']:.2f}", acc,
            f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}×", f"{r['decode_speedup']:.2f}×",
            f"{100 * r['draft_share']:.0f}",
            f"{100 * r['counterfactual_share']:.0f}", f"{r['catch_up_ms']:.0f}",
            "yes" if r["exact"] else "NO",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spec_bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--pair", action="append", required=True, metavar="TARGET=DRAFTER[,DRAFTER]", help="repeatable"
    )
    p.add_argument(
        "--workload",
        action="append",
        required=True,
        help="workload file, or a content name (chat, code, alpaca, a Spec-Bench category); repeatable",
    )
    p.add_argument("--data", default=DATA_DIR, help="the shared data directory (for content names)")
    p.add_argument("--gammas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    p.add_argument("--batch1-prompts", type=int, default=4, help="prompts run one at a time at batch 1")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--scoring",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[0, 1],
        help="counterfactual_every values to run each speculative configuration with (0: no scoring)",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: small products stall on 2 shared cores)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every measurement here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows, cycles = [], {}
    for pair in args.pair:
        target, _, drafters = pair.partition("=")
        r, cycle = bench_pair(Path(target), [Path(d) for d in drafters.split(",") if d], args)
        rows += r
        cycles[Path(target).name] = cycle
        print(table(r), flush=True)
        print(json.dumps(cycles[Path(target).name]), flush=True)
    print("\n" + table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "memory": cycles}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
