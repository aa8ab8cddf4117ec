"""Is nightjar free when it decides not to speculate? (issue 25, item 2)

One engine with every bundled drafter loaded (SmolLM2: both feature heads and n-gram), a
closed loop of B users (each request greedy, EOS ignored, ``--max-tokens``; a finished one is
replaced at once by the next prompt) under two decisions, alternating round by round:

- ``static-0``: γ = 0 for every batch size (the static policy's decision);
- ``nightjar``: the nightjar policy's decision, its cost profile measured by the worker's own
  profiler on this engine and its acceptance learnt from a short speculative warm-up at batch 1
  on the same content (the planner's view after a quiet phase).

Both emit the same tokens (greedy: the target's alone), so where nightjar runs γ = 0 the two
runs do the same work but for what adapting adds. Prints, per B, the seconds per output token
of each, their ratio (issue 25: ≤ 1.02), the steps nightjar ran at γ > 0 and the prompts its
drafters scored.

    taskset -c 1 python -m benchmarks.gamma0_cost --model models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.load.contents import ContentLibrary
from nightjar.options import drafter_dirs
from planner.policies.nightjar import NightjarPolicy
from shared.control import ALL_BATCHES, Decision, Telemetry
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.profiling import ProfileSettings, profile_engine
from worker.speculation import apply_decision

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class Run:
    seconds: float = 0.0  # step time, summed
    tokens: int = 0
    spec_steps: int = 0
    steps: int = 0
    prompts_scored: int = 0

    @property
    def per_token(self) -> float:
        return self.seconds / max(self.tokens, 1)


def prompts(engine: LLMEngine, data: Path, content: str, count: int, max_len: int) -> list[list[int]]:
    """Chat-templated (chat) or raw (code) prompt ids of ``content``."""
    tok = engine.tokenizer
    out: list[list[int]] = []
    for item in ContentLibrary(data).get(content):
        if content == "code":
            ids = tok.encode(item.prompt)
        else:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": item.prompt}], add_generation_prompt=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if len(ids) <= max_len:
            out.append(list(ids))
        if len(out) == count:
            break
    return out


def closed_loop(
    engine: LLMEngine, decision: Decision, ids: list[list[int]], users: int, max_tokens: int
) -> Run:
    """``users`` requests at a time over ``ids``; the engine's step times summed."""
    apply_decision(engine, decision)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    queue = list(enumerate(ids))
    run = Run()
    live = 0
    tag = f"{decision.policy}-{time.perf_counter_ns()}"
    while queue or live:
        while queue and live < users:
            i, p = queue.pop(0)
            engine.add_request(EngineRequest(f"{tag}-{i}", p, params))
            live += 1
        result = engine.step()
        s = result.stats
        run.seconds += s.step_time
        run.tokens += s.num_tokens
        run.steps += 1
        run.spec_steps += s.gamma > 0
        run.prompts_scored += s.prompts_scored
        live -= sum(1 for o in result.outputs if o.finished)
    return run


def nightjar_decision(engine: LLMEngine, model: str, warm: list[list[int]], budget: float) -> Decision:
    """The nightjar policy's decision after the worker's profile and a speculative warm-up."""
    profile = profile_engine(engine, model, ProfileSettings(budget_s=budget))
    if profile is None:
        raise SystemExit("the profile did not finish batch 1 within its budget")
    policy = NightjarPolicy(offload=False)
    policy.use_profile(profile)

    def decision(version: int) -> Decision:
        c = policy.decide(0.0)
        return Decision(
            version=version, policy="nightjar", gamma_table=c.gamma_table, drafter=c.drafter,
            drafter_scope="request", score_drafters=c.score_drafters, step_costs=c.step_costs,
            acceptance=c.acceptance, acceptance_hi=c.acceptance_hi, hold_steps=c.hold_steps,
            hold_by_drafter=c.hold_by_drafter, hold_tokens=c.hold_tokens,
        )  # fmt: skip

    apply_decision(engine, decision(1))
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    for i, p in enumerate(warm):  # one user at a time: the rule speculates, the policy learns
        engine.add_request(EngineRequest(f"warm-{i}", p, params))
        while engine.has_unfinished():
            stats = engine.step().stats
            policy.observe(Telemetry(worker_id="bench", **stats.model_dump()))
        apply_decision(engine, decision(i + 2))
    return decision(len(warm) + 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=str(DATA))
    ap.add_argument("--batches", default="16,32")
    ap.add_argument("--content", default="chat", help="chat or code")
    ap.add_argument("--requests", type=int, default=3, help="requests per user per run")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile-budget", type=float, default=60.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    drafters = drafter_dirs(args.model, None)
    engine = load_engine(args.model, drafters=drafters, num_blocks=4096)
    batches = [int(b) for b in args.batches.split(",")]
    ids = prompts(
        engine, Path(args.data_dir), args.content, max(batches) * args.requests + 4, args.max_prompt
    )
    print(f"model {args.model}, drafters {engine.drafter_names}, content {args.content}")
    nightjar = nightjar_decision(engine, args.model, ids[-4:], args.profile_budget)
    print("nightjar decision:", nightjar.note or nightjar.gamma_table, "acceptance", nightjar.acceptance,
          "hi", nightjar.acceptance_hi, "hold", nightjar.hold_steps)  # fmt: skip
    static = Decision(version=1, policy="static-0", gamma_table=[(ALL_BATCHES, 0)])
    print("\n| users | static-0 ms/token | nightjar ms/token | nightjar / static-0 | nightjar steps at γ > 0 "
          "| prompts scored | rounds (ratio) |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for users in batches:
        work = ids[: users * args.requests]
        ratios: list[float] = []
        per: dict[str, list[float]] = {"static-0": [], "nightjar": []}
        spec, scored = 0, 0
        for r in range(args.rounds):
            order = [("static-0", static), ("nightjar", nightjar)]
            runs = {}
            for name, d in order if r % 2 == 0 else order[::-1]:
                runs[name] = closed_loop(engine, d, work, users, args.max_tokens)
            ratios.append(runs["nightjar"].per_token / runs["static-0"].per_token)
            for name, run in runs.items():
                per[name].append(run.per_token)
            spec += runs["nightjar"].spec_steps
            scored += runs["nightjar"].prompts_scored
        a, b = statistics.median(per["static-0"]), statistics.median(per["nightjar"])
        each = " · ".join(f"{x:.3f}" for x in ratios)
        ratio = statistics.median(ratios)
        print(f"| {users} | {1000 * a:.2f} | {1000 * b:.2f} | {ratio:.3f} | {spec} | {scored} | {each} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
