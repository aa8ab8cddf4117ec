"""One user in the engine: the nightjar policy, live, against one static setting, prompt by prompt.

A quick look at one regime without the services: one engine with every bundled drafter, the
nightjar policy deciding from the worker's own cost profile and from the engine's telemetry
(it re-decides every ``--redecide`` steps, as the served planner publishes), first warmed on
a few requests (``--warm``: mixed content, or one content, as after a phase of it), then each
prompt of ``--content`` run once under nightjar and once under the static setting, in
alternating order. Prints nightjar's steps by (γ, drafter) — their step time, tokens a step,
time a token — and the ratio of the static setting's time per token to nightjar's (> 1:
nightjar faster). Greedy, EOS ignored; step times only (no serving around them), so it shows
what the rule chooses and what that costs, not the served verdict (BENCHMARKS.md §1).

    taskset -c 1 python -m benchmarks.regime_probe --content chat --static smol-eagle-chat:2
    taskset -c 1 python -m benchmarks.regime_probe --content code --static ngram:4 --warm chat
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.gamma0_cost import DATA, prompts
from nightjar.options import drafter_dirs
from planner.policies.nightjar import NightjarPolicy
from shared.control import ALL_BATCHES, Decision, Telemetry
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.profiling import ProfileSettings, profile_engine
from worker.speculation import apply_decision

Row = tuple[float, int]  # (step seconds, tokens) of one batch-1 decode step


class LivePolicy:
    """The nightjar policy fed by the engine's telemetry, as the planner runs it."""

    def __init__(self, engine: LLMEngine, model: str, budget: float) -> None:
        profile = profile_engine(engine, model, ProfileSettings(budget_s=budget))
        if profile is None:
            raise SystemExit("the profile did not finish batch 1 within its budget")
        self.policy = NightjarPolicy(offload=False)
        self.policy.use_profile(profile)
        self.version = 0

    def decision(self) -> Decision:
        c = self.policy.decide(0.0)
        self.version += 1
        return Decision(
            version=self.version, policy="nightjar", gamma_table=c.gamma_table, drafter=c.drafter,
            drafter_scope="request", score_drafters=c.score_drafters, step_costs=c.step_costs,
            acceptance=c.acceptance, acceptance_hi=c.acceptance_hi, hold_steps=c.hold_steps,
            hold_by_drafter=c.hold_by_drafter, hold_tokens=c.hold_tokens,
        )  # fmt: skip

    def observe(self, engine: LLMEngine) -> Telemetry:
        t = Telemetry(worker_id="probe", **engine.step().stats.model_dump())
        self.policy.observe(t)
        return t


def run(
    engine: LLMEngine, rid: str, ids: list[int], tokens: int, live: LivePolicy | None, every: int
) -> list[tuple[tuple[int, str], Row]]:
    """One request to the end: its batch-1 decode steps by (γ, drafter)."""
    engine.add_request(EngineRequest(rid, ids, SamplingParams(max_tokens=tokens, ignore_eos=True)))
    out, n = [], 0
    while engine.has_unfinished():
        if live is not None:
            s = live.observe(engine)
            n += 1
            if n % every == 0:
                apply_decision(engine, live.decision())
        else:
            s = Telemetry(worker_id="probe", **engine.step().stats.model_dump())
        if s.batch_size == 1 and s.prefill_tokens == 0:
            out.append(((s.gamma, s.drafter or "-"), (s.step_time, s.num_tokens)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=str(DATA))
    ap.add_argument("--dtype", default="float32", help="the verdict's precision (fp32)")
    ap.add_argument("--content", default="chat", help="chat or code")
    ap.add_argument("--static", default="smol-eagle-chat:2", help="DRAFTER:GAMMA to compare with")
    ap.add_argument("--warm", default="mixed", help="mixed, chat or code: the policy's warm-up content")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--redecide", type=int, default=25, help="steps between nightjar's decisions")
    ap.add_argument("--profile-budget", type=float, default=90.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    data = Path(args.data_dir)
    engine = load_engine(
        args.model, drafters=drafter_dirs(args.model, None), num_blocks=4096, dtype=args.dtype
    )
    ids = prompts(engine, data, args.content, args.prompts, 256)
    live = LivePolicy(engine, args.model, args.profile_budget)
    if args.warm == "mixed":
        warm = prompts(engine, data, "code", 2, 256) + prompts(engine, data, "chat", 2, 256)
    else:
        warm = prompts(engine, data, args.warm, args.prompts + 4, 256)[-4:]
    for i, p in enumerate(warm):
        apply_decision(engine, live.decision())
        run(engine, f"warm-{i}", p, 48, live, args.redecide)
    drafter, gamma = args.static.rsplit(":", 1)
    static = Decision(
        version=10**9, policy="static", gamma_table=[(ALL_BATCHES, int(gamma))], drafter=drafter,
        score_drafters=False,
    )  # fmt: skip
    steps: dict[str, dict[tuple[int, str], list[Row]]] = {
        "nightjar": defaultdict(list),
        "static": defaultdict(list),
    }
    for i, p in enumerate(ids):
        for name in ("nightjar", "static") if i % 2 == 0 else ("static", "nightjar"):
            nj = name == "nightjar"
            apply_decision(engine, live.decision() if nj else static)
            for key, row in run(
                engine, f"{name}-{i}", p, args.max_tokens, live if nj else None, args.redecide
            ):
                steps[name][key].append(row)
    per_token = {}
    for name, by in steps.items():
        rows = [r for rs in by.values() for r in rs]
        per_token[name] = sum(r[0] for r in rows) / max(sum(r[1] for r in rows), 1)
        print(f"== {name}: {1000 * per_token[name]:.2f} ms a token over {len(rows)} steps")
        for (g, d), rs in sorted(by.items(), key=lambda kv: -len(kv[1])):
            step = statistics.mean(r[0] for r in rs)
            tok = statistics.mean(r[1] for r in rs)
            print(
                f"  γ {g} {d:18s} steps {len(rs):4d}  {1000 * step:6.2f} ms  {tok:.2f} tok/step"
                f"  {1000 * step / tok:6.2f} ms/tok"
            )
    print(
        f"content {args.content}, warm-up {args.warm}: static {args.static} ÷ nightjar time a token = "
        f"{per_token['static'] / per_token['nightjar']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
