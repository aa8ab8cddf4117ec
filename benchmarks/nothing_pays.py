"""Where nothing pays: what γ = 0-mostly speculation costs against plain decoding, per step.

Builds the engine as the worker does (``create_engine``) twice — with the target's drafters
(SmolLM2: its two EAGLE-style feature heads and n-gram) and with none — and serves the same
greedy requests (ShareGPT first turns, chat template; ``--users`` at a time, ``--requests`` in
all, ``--max-tokens`` each) under three schedules, interleaved over ``--rounds``:

* ``no-spec``: no drafters at all (the baseline);
* ``gamma0``: drafters resident, the decision γ = 0 on every step;
* ``mostly0``: drafters resident, per-request drafter scope, γ = 0 except one step of γ = 2 in
  every ``--every`` (the drafter named by the decision rotating between them), roughly the
  mixed phase's 97 % γ = 0 under nightjar.

Each schedule has its own engine and they are stepped in turn (lockstep), so load from other
processes hits them alike; prefix caching is off, so every round prefills fresh prompts. ``--gamma2``
adds γ = 2 on every step (its acceptance shows what a ``--window``, the feature drafters'
``max_pending``, costs).

Prints tokens/s and its ratio to no-spec, and per step (ms): total, draft, verify, other
(step − draft − verify), the catch-up inside draft (``switch_costs``) and the counterfactual
scoring; the output of every schedule is checked equal to no-spec's (greedy: exact). Run on
one core and one torch thread, as the regime benchmark's worker does:

    taskset -c 0 .venv/bin/python -m benchmarks.nothing_pays
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.load.contents import ContentLibrary
from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine_factory import create_engine
from worker.speculation import apply_decision

COUNTS: dict[int, dict[str, int]] = {}  # per engine: tokens each model drafter computed
DATA = Path(__file__).resolve().parents[2] / "shared/data/workloads/sharegpt_v3_filtered_1000.json"


@dataclass
class Totals:
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.parts[key] = self.parts.get(key, 0.0) + value


def prompts(tokenizer: Any, n: int, max_prompt: int, content: str = "chat") -> list[list[int]]:
    """``n`` prompts of at most ``max_prompt`` tokens: ShareGPT first turns in the chat template
    (``chat``), or the regime benchmark's raw-text sources joined by ``+`` and alternated (e.g.
    ``stories+code`` for nj-target)."""
    if content != "chat":
        return _raw_prompts(tokenizer, n, max_prompt, content.split("+"))
    rows = json.loads(DATA.read_text(encoding="utf-8"))
    out = []
    for row in rows:
        text = next((c["value"] for c in row["conversations"] if c["from"] == "human"), "")
        if not text.strip():
            continue
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer.encode(chat, add_special_tokens=False)
        if len(ids) <= max_prompt:
            out.append(list(ids))
        if len(out) == n:
            break
    return out


def _raw_prompts(tokenizer: Any, n: int, max_prompt: int, sources: list[str]) -> list[list[int]]:
    library = ContentLibrary(DATA.parents[1])
    pools = [iter(library.get(name)) for name in sources]
    out: list[list[int]] = []
    while len(out) < n:
        for pool in pools:
            ids = tokenizer.encode(next(pool).prompt)
            if len(ids) <= max_prompt and len(out) < n:
                out.append(list(ids))
    return out


def decision(version: int, gamma: int, drafter: str | None) -> Decision:
    return Decision(
        version=version,
        policy="bench",
        gamma_table=[(ALL_BATCHES, gamma)],
        drafter=drafter,
        drafter_scope="request",
        valid_for_s=1e9,
    )


class Run:
    """One schedule serving every prompt, ``users`` at a time, one engine step per ``step()``."""

    def __init__(
        self,
        engine: Any,
        batch: list[list[int]],
        users: int,
        max_tokens: int,
        schedule: Callable[[int], Decision | None],
        tag: str,
    ) -> None:
        self.engine, self.users, self.schedule, self.tag = engine, users, schedule, tag
        self.queue = list(enumerate(batch))
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.out = Totals()
        self.live = 0
        self.n = 0
        self.counts = COUNTS.get(id(engine), {})

    def step(self) -> bool:
        """One engine step; False once every request has finished."""
        out, engine = self.out, self.engine
        while self.queue and self.live < self.users:
            i, ids = self.queue.pop(0)
            engine.add_request(EngineRequest(f"{self.tag}{i}", ids, self.params))
            out.outputs[f"r{i}"] = []
            self.live += 1
        if not (self.queue or engine.has_unfinished()):
            return False
        d = self.schedule(self.n)
        if d is not None:
            apply_decision(engine, d)
        self.n += 1
        before = sum(self.counts.values())
        t0 = time.perf_counter()
        res = engine.step()
        out.seconds += time.perf_counter() - t0
        out.add("drafter tokens", sum(self.counts.values()) - before)
        st = res.stats
        for o in res.outputs:
            out.outputs["r" + o.request_id[len(self.tag) :]] += o.new_token_ids
            self.live -= o.finished
        out.tokens += st.num_tokens
        if st.batch_size:  # the parts are per decoding step (prefill-only steps count in tok/s)
            out.steps += 1
            out.add("step", st.step_time)
            out.add("draft", st.draft_time)
            out.add("verify", st.verify_time)
            out.add("other", st.other_time)
            out.add("catch-up", sum(e.seconds for e in st.switch_costs))
            out.add("counterfactual", st.counterfactual_time)
            out.add("spec steps", float(st.gamma > 0))
            out.add("proposed", st.proposed)
            out.add("accepted", st.accepted)
        return True


def count_drafter_tokens(engine: Any) -> dict[str, int]:
    """Wrap every model drafter's runner to count the tokens it computes (a cost with no noise)."""
    counts: dict[str, int] = {}
    for d in engine.spec.pool.models if engine.spec.pool else []:
        counts[d.name] = 0

        def counted(items: Any, run: Any = d.runner.run, name: str = d.name) -> Any:
            counts[name] += sum(len(i.token_ids) for i in items)
            return run(items)

        d.runner.run = counted
    return counts


def lockstep(runs: list[Run]) -> None:
    """Step every run in turn until all are done: load on the machine hits them alike."""
    live = list(runs)
    while live:
        live = [r for r in live if r.step()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--drafters", nargs="*", default=["models/smol-eagle-chat", "models/smol-eagle-code"])
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--content", default="chat", help="chat (ShareGPT, chat template) or e.g. stories+code")
    ap.add_argument("--every", type=int, default=30, help="mostly0: one γ = 2 step in this many")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--window", type=int, help="feature drafters' max_pending (default: theirs)")
    ap.add_argument("--gamma2", action="store_true", help="also run γ = 2 on every step (acceptance)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # No prefix caching: every round prefills its prompts again (a cached prompt has no features,
    # so a feature drafter would have less to catch up than on fresh traffic).
    opts = {"num_blocks": 512, "max_num_seqs": args.users, "enable_prefix_caching": False}
    plain: Any = create_engine(args.model, drafters=[], ngram=False, **opts)  # an LLMEngine
    specs: list[Any] = [
        create_engine(args.model, drafters=args.drafters, ngram=True, **opts) for _ in range(2 + args.gamma2)
    ]
    for e in specs:
        for f in e.spec.pool.features if args.window else []:
            f.max_pending = args.window
    names = list(specs[0].spec.pool.drafters) if specs[0].spec.pool else []
    for e in specs:  # one engine per schedule: the schedules run step by step in lockstep
        COUNTS[id(e)] = count_drafter_tokens(e)
    batch = prompts(plain.tokenizer, args.requests, args.max_prompt, args.content)

    def mostly0(step: int) -> Decision:
        if step % args.every == args.every - 1:
            return decision(step + 1, 2, names[(step // args.every) % len(names)])
        return decision(step + 1, 0, None)

    schedules: dict[str, tuple[Any, Callable[[int], Decision | None]]] = {
        "no-spec": (plain, lambda step: None),
        "gamma0": (specs[0], lambda step: decision(step + 1, 0, None)),
        "mostly0": (specs[1], mostly0),
    }
    if args.gamma2:
        schedules["gamma2"] = (specs[2], lambda step: decision(step + 1, 2, None))
    load0 = os.getloadavg()
    results: dict[str, list[Totals]] = {k: [] for k in schedules}
    for rnd in range(args.rounds + 1):  # the first round warms up and is dropped
        prompts_r = batch[: args.users] if rnd == 0 else batch
        batch_runs = [
            Run(engine, prompts_r, args.users, args.max_tokens, schedule, f"{name}-{rnd}-")
            for name, (engine, schedule) in schedules.items()
        ]
        lockstep(batch_runs)
        for name, run in zip(schedules, batch_runs, strict=True):
            results[name].append(run.out)
    load1 = os.getloadavg()
    ref = results["no-spec"][1:]
    for name, runs in results.items():
        for r, base in zip(runs, results["no-spec"], strict=True):
            assert r.outputs == base.outputs, f"{name}: output differs from no-spec"
    print(
        f"{args.model} + {', '.join(names) or 'no drafters'}; {args.requests} requests, {args.users} users, "
        f"{args.max_tokens} tokens, torch threads {torch.get_num_threads()}; load average "
        f"{load0[0]:.2f} -> {load1[0]:.2f} ({os.cpu_count()} cores); {args.rounds} rounds (median)"
    )
    base_tps = statistics.median(t.tokens / t.seconds for t in ref)
    keys = ["step", "draft", "verify", "other", "catch-up", "counterfactual", "drafter tokens"]
    head = " ".join(f"{k:>14s}" for k in keys)
    print(f"{'schedule':10s} {'tok/s':>7s} {'x no-spec':>9s} {head}  spec%")
    for name, runs in results.items():
        runs = runs[1:]
        tps = statistics.median(t.tokens / t.seconds for t in runs)
        ms = [statistics.median(1000 * t.parts.get(k, 0.0) / t.steps for t in runs) for k in keys[:-1]]
        ms.append(statistics.median(t.parts.get(keys[-1], 0.0) / t.steps for t in runs))
        spec_share = statistics.median(100 * t.parts.get("spec steps", 0.0) / t.steps for t in runs)
        row = " ".join(f"{v:14.2f}" for v in ms)
        acc = sum(t.parts.get("accepted", 0.0) for t in runs) / max(
            1.0, sum(t.parts.get("proposed", 0.0) for t in runs)
        )
        print(f"{name:10s} {tps:7.1f} {tps / base_tps:9.3f} {row}  {spec_share:4.1f}  acceptance {acc:.3f}")
    print("per decoding step: ms, and tokens the model drafters computed; every output equals no-spec's")


if __name__ == "__main__":
    main()
