"""Seeded (keyed) sampling against rejection sampling: acceptance, and what the draws cost.

Acceptance: a target and its drafters on held-out prompts (``chat``: ShareGPT prompts no
drafter was trained on; benchmarks/load/contents.py), ``--max-tokens`` sampled tokens per
prompt, ``--batch`` prompts at a time, at every temperature, γ and drafter under a static
decision, twice: every request seeded (keyed draws, drafts coupled to the target's noise, a
draft kept when it is the target's own draw: worker/engine/keyed.py) and every request
unseeded (drafts from the request's generator, rejection sampling). Per configuration: α_j,
the acceptance at draft position j given the drafts before it were accepted (the engine's
``accepted_per_pos``), α = accepted / judged drafts (up to and including the first rejected
one, as the engine reports it), and tokens per verification (accepted + 1 per verified
sequence). Both schemes see different texts (each is its own sample), so these α carry the
noise of 32-odd texts.

Paired, the same contexts for both: in the seeded run, at every draft position a verification
reached (the drafts before it accepted), the keyed draft's acceptance (0 or 1) and what
rejection sampling would accept there in expectation, Σ_x min(p, q) — p the target's warped
row, q the drafter's, on the very same prefix. Their conditional rates α_j give
E = 1 + Σ_j Π_{i≤j} α_i for either scheme on one set of texts.

Cost (``--cost-batches``): the same prompts at temperature 1 (EOS ignored), seeded against
unseeded, with γ = 0 and with the first drafter at γ = 2, rounds alternating so a noisy machine
slows both alike; the median time of a decode step (no prefill in it) and its ratio. And the
sampling work alone, on the target's own rows (its logits over the prompts, temperature 1):
``verify_batch`` of γ + 1 rows a sequence and one drafter's draw a sequence, seeded against
unseeded, alternating, medians (benchmarks/seeded_sampling.py).

    python -m benchmarks.seeded_bench --target models/smollm2-135m-instruct \\
        --drafter models/smol-eagle-chat --drafter models/smol-eagle-code --workload chat
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.seeded_sampling import SCHEMES, sampling_cost
from benchmarks.spec_bench import DATA_DIR, prompts_for
from shared.control import ALL_BATCHES, Decision, StepStats
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.keyed import keyed_draw
from worker.engine.loader import load_engine
from worker.engine.records import Verified
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.speculator import Feedback
from worker.engine.spec.verify import overlap
from worker.speculation import apply_decision

_versions = itertools.count(1)


@dataclass
class Tally:
    """One configuration's speculative steps, summed."""

    drafter: str
    temperature: float
    gamma: int
    scheme: str
    verifications: int = 0  # sequences whose drafts were verified
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)  # accepted drafts at each draft position
    tokens: int = 0

    def add(self, stats: list[StepStats]) -> None:
        for s in stats:
            if s.gamma == 0 or not s.num_drafts:
                continue
            self.verifications += s.num_drafts
            self.accepted += s.accepted
            self.per_pos += [0] * (len(s.accepted_per_pos) - len(self.per_pos))
            for j, n in enumerate(s.accepted_per_pos):
                self.per_pos[j] += n

    def row(self) -> dict[str, Any]:
        reached = [self.verifications, *self.per_pos]
        cond = [reached[j + 1] / reached[j] if reached[j] else 0.0 for j in range(self.gamma)]
        return {
            "drafter": self.drafter,
            "temperature": self.temperature,
            "gamma": self.gamma,
            "scheme": self.scheme,
            "verifications": self.verifications,
            "alpha_per_pos": cond,
            # Judged drafts: a verification of γ drafts judges one more than it accepted, or γ.
            "alpha": self.accepted / max(self.verifications + sum(self.per_pos[: self.gamma - 1]), 1),
            "tokens_per_verify": (self.accepted + self.verifications) / max(self.verifications, 1),
        }


@dataclass
class Paired:
    """Per draft position of the seeded run's verifications: the positions reached, the keyed
    drafts accepted there, and rejection sampling's expected acceptance on the same rows."""

    reached: list[int] = field(default_factory=list)
    keyed: list[int] = field(default_factory=list)
    rejection: list[float] = field(default_factory=list)
    # Other draft rules at each verification's first draft position, on the same noise:
    # q sharpened to q^β before the keyed draw (β = ∞: q's mode) → drafts the target kept.
    betas: tuple[float, ...] = ()
    first: dict[float, int] = field(default_factory=dict)

    def observe(self, verified: list[Verified]) -> None:
        rows, seeds, positions, kept = [], [], [], []
        for v in verified:
            d = v.drafted
            if d is None or not d.tokens or not v.seq.keyed or d.q is None or v.p is None:
                continue
            rows.append(d.q[:1])
            seeds.append(v.seq.params.seed or 0)
            positions.append(v.seq.position(d.start))
            kept.append(v.emitted[0])
            accepted = len(v.emitted) - 1
            for j in range(min(accepted + 1, len(d.tokens))):
                if j == len(self.reached):
                    self.reached.append(0)
                    self.keyed.append(0)
                    self.rejection.append(0.0)
                self.reached[j] += 1
                self.keyed[j] += j < accepted
                self.rejection[j] += float(overlap(v.p[j : j + 1], d.q[j : j + 1]))
        if rows and self.betas:
            q = torch.cat(rows).double()
            for beta in self.betas:
                if beta == float("inf"):
                    drafts = q.argmax(-1).tolist()
                else:
                    sharp = q.pow(beta)
                    drafts = keyed_draw(sharp / sharp.sum(-1, keepdim=True), seeds, positions)
                self.first[beta] = self.first.get(beta, 0) + sum(
                    a == b for a, b in zip(drafts, kept, strict=True)
                )

    def rates(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, hits in (("keyed", self.keyed), ("rejection", self.rejection)):
            alpha = [h / n if n else 0.0 for h, n in zip(hits, self.reached, strict=True)]
            run, e = 1.0, 1.0
            for a in alpha:
                run *= a
                e += run
            out[name] = {"alpha_per_pos": alpha, "tokens_per_verify": e}
        out["first_positions"] = self.reached[0] if self.reached else 0
        if self.first and self.reached:
            out["first_by_beta"] = {str(b): n / self.reached[0] for b, n in self.first.items()}
        return out


@contextmanager
def watching(engine: LLMEngine, paired: Paired) -> Iterator[None]:
    """Hand every step's verified sequences to ``paired`` (through the speculator's feedback)."""
    feedback = engine.spec.feedback

    def watched(drafter: Drafter | None, verified: list[Verified]) -> Feedback:
        paired.observe(verified)
        return feedback(drafter, verified)

    engine.spec.feedback = watched  # type: ignore[method-assign]
    try:
        yield
    finally:
        engine.spec.feedback = feedback  # type: ignore[method-assign]


def decide(engine: LLMEngine, gamma: int, drafter: str | None) -> None:
    apply_decision(
        engine,
        Decision(
            version=next(_versions),
            policy="seeded-bench",
            gamma_table=[(ALL_BATCHES, gamma)],
            drafter=drafter,
            score_drafters=False,
        ),
    )


def generate(
    engine: LLMEngine, prompts: list[list[int]], batch: int, params: SamplingParams, seeded: bool, tag: str
) -> tuple[list[StepStats], int]:
    """Every prompt, ``batch`` at a time (request i seeded with i when ``seeded``); returns the
    step stats and the tokens generated."""
    stats: list[StepStats] = []
    tokens = 0
    for g in range(0, len(prompts), batch):
        for i in range(g, min(g + batch, len(prompts))):
            p = params.model_copy(update={"seed": i if seeded else None})
            engine.add_request(EngineRequest(f"{tag}-{i}", prompts[i], p))
        while engine.has_unfinished():
            result = engine.step()
            stats.append(result.stats)
            tokens += sum(len(o.new_token_ids) for o in result.outputs)
    return stats, tokens


def acceptance(engine: LLMEngine, prompts: list[list[int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in engine.drafter_names:
        if name == "ngram" and not args.ngram:
            continue
        for temp in args.temperatures:
            for gamma in args.gammas:
                paired = Paired(betas=tuple(args.sharpen))
                for scheme in args.schemes:
                    decide(engine, gamma, name)
                    tally = Tally(name, temp, gamma, scheme)
                    params = SamplingParams(max_tokens=args.max_tokens, temperature=temp)
                    with watching(engine, paired):
                        stats, tally.tokens = generate(
                            engine,
                            prompts,
                            args.batch,
                            params,
                            scheme == "keyed",
                            f"{name}{temp}{gamma}{scheme}",
                        )
                    tally.add(stats)
                    rows.append(tally.row() | ({"paired": paired.rates()} if scheme == "keyed" else {}))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def cost(engine: LLMEngine, prompts: list[list[int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    drafter = next(n for n in engine.drafter_names if n != "ngram")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)  # equal lengths
    out = []
    for batch in args.cost_batches:
        configs = [(g, d, s) for g, d in ((0, None), (2, drafter)) for s in SCHEMES]
        steps: dict[tuple[int, str | None, str], list[float]] = {c: [] for c in configs}
        for r in range(args.rounds):
            for c in configs:
                gamma, d, scheme = c
                decide(engine, gamma, d)
                stats, _ = generate(engine, prompts[:batch], batch, params, scheme == "keyed", f"c{r}{c}")
                steps[c] += [s.step_time for s in stats if s.prefill_tokens == 0 and s.batch_size == batch]
        for gamma, d in ((0, None), (2, drafter)):
            keyed = statistics.median(steps[(gamma, d, "keyed")])
            plain = statistics.median(steps[(gamma, d, "rejection")])
            out.append(
                {
                    "batch": batch,
                    "gamma": gamma,
                    "drafter": d,
                    "keyed_ms": 1e3 * keyed,
                    "unseeded_ms": 1e3 * plain,
                    "ratio": keyed / plain,
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def tables(rows: list[dict[str, Any]], costs: list[dict[str, Any]], sampling: list[dict[str, Any]]) -> str:
    lines = [
        "| drafter | T | γ | scheme | verifications | α per draft position | α | tokens / verify |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = " / ".join(f"{a:.2f}" for a in r["alpha_per_pos"])
        lines.append(
            f"| {r['drafter']} | {r['temperature']} | {r['gamma']} | {r['scheme']} | {r['verifications']} | "
            f"{per} | {r['alpha']:.3f} | {r['tokens_per_verify']:.3f} |"
        )
    paired = [r for r in rows if "paired" in r]
    if paired:
        lines += [
            "",
            "| drafter | T | γ | positions | keyed α_j | rejection α_j (Σ min) | keyed E | rejection E |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in paired:
            k, j = r["paired"]["keyed"], r["paired"]["rejection"]
            lines.append(
                f"| {r['drafter']} | {r['temperature']} | {r['gamma']} | {r['paired']['first_positions']} | "
                + " / ".join(f"{a:.3f}" for a in k["alpha_per_pos"])
                + " | "
                + " / ".join(f"{a:.3f}" for a in j["alpha_per_pos"])
                + f" | {k['tokens_per_verify']:.3f} | {j['tokens_per_verify']:.3f} |"
            )
    if sampling:
        lines += [
            "",
            "| batch | γ | verify_batch ms seeded / unseeded | a draft draw ms seeded / unseeded |",
            "|---|---|---|---|",
        ]
        for c in sampling:
            lines.append(
                f"| {c['batch']} | {c['gamma']} | {c['verify-keyed']:.2f} / {c['verify-rejection']:.2f} | "
                f"{c['draw-keyed']:.3f} / {c['draw-rejection']:.3f} |"
            )
    if costs:
        lines += [
            "",
            "| batch | γ | drafter | seeded step ms | unseeded step ms | ratio |",
            "|---|---|---|---|---|---|",
        ]
        for c in costs:
            lines.append(
                f"| {c['batch']} | {c['gamma']} | {c['drafter'] or '–'} | {c['keyed_ms']:.1f} | "
                f"{c['unseeded_ms']:.1f} | {c['ratio']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.seeded_bench", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--target", required=True)
    p.add_argument(
        "--drafter", action="append", default=[], help="a model drafter or head directory; repeatable"
    )
    p.add_argument("--ngram", action="store_true", help="measure the n-gram drafter too")
    p.add_argument("--workload", action="append", default=None, help="workload file or content name (chat)")
    p.add_argument("--data", default=DATA_DIR)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.7, 1.0])
    p.add_argument("--gammas", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    p.add_argument("--cost-batches", type=lambda s: [int(x) for x in s.split(",") if x], default=[])
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of the cost measurement")
    p.add_argument("--skip-acceptance", action="store_true")
    p.add_argument("--schemes", type=lambda s: s.split(","), default=list(SCHEMES), help="keyed,rejection")
    p.add_argument(
        "--sharpen",
        type=lambda s: [float(x) for x in s.split(",") if x],
        default=[],
        help="also score these β at the first draft position: a keyed draw from q^β (inf: q's mode)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="which prompts")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = Path(args.target)
    prompts = prompts_for(
        target, args.workload or ["chat"], args.prompts, args.max_prompt_tokens, args.seed, args.data
    )
    per_seq = -(-(args.max_prompt_tokens + args.max_tokens + max(args.gammas) + 1) // 16)
    batch = max([args.batch, *args.cost_batches])
    engine = load_engine(
        target,
        drafters=[Path(d) for d in args.drafter],
        ngram=args.ngram,
        enable_prefix_caching=False,
        max_num_seqs=batch,
        num_blocks=3 * batch * per_seq // 2 + 8,
    )
    t0 = time.perf_counter()
    rows = [] if args.skip_acceptance else acceptance(engine, prompts, args)
    costs = cost(engine, prompts, args) if args.cost_batches else []
    sampling = sampling_cost(target, prompts, args) if args.cost_batches else []
    print("\n" + tables(rows, costs, sampling))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "rows": rows, "cost": costs, "sampling": sampling}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
