"""The startup cost profile: the worker's own engine, stepped on synthetic sequences.

Before it takes jobs a worker measures what a decoding step costs it (``shared.profile.
CostProfile``, the planner's prior): for each batch size (powers of two up to ``max_batch``)
it adds that many synthetic requests (random prompt ids, greedy, ``ignore_eos``), prefills
them, and then steps the engine through its public contract only (``apply_plan``, from a decision with a
γ and a drafter, ``step``), reading each step's ``StepStats``:

- the target's time over q = γ + 1 rows per sequence: ``step_time − draft_time − catch-up``
  of the steps where every sequence drafted γ tokens (q = 1: the γ = 0 steps), measured with
  the first drafter that drafts in full;
- each drafter's step time: ``draft_time / γ``;
- each drafter's catch-up: the ``SwitchCostEvent`` of its first draft after γ = 0 steps,
  seconds per caught-up token per sequence (0 for a drafter that has nothing to catch up).

A step counts only when its decoding batch is exactly the batch measured and nothing else
ran in it (no prefill, no catch-up). The pass goes over every batch size ``reps`` times,
one step per point each time, and keeps the fastest (on a shared machine the noise is other
processes' bursts, which only ever add time); so when the budget (``budget_s``) runs out in
a later round the profile still covers every batch size; a first round cut short keeps the
batch sizes it finished, smallest first (None if not even batch 1 was done). Taking the
largest first was tried: under heavy load it spent the whole budget on a batch it could not
finish.
Every synthetic request is aborted before it returns.

Run again while serving (after an elastic-memory move changed the KV pool, or to refresh a
cached profile), it starts only when the engine is idle and gives up before its next step
once ``waiting()`` says a job was admitted (the step in flight ends first: the job waits for
at most that one step), or at the first step that also carries a real request, handing that
step's outputs back to the caller: a job's output is never dropped, and no measurement mixes
it in.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

from shared.control import ALL_BATCHES, Decision
from shared.profile import CostProfile
from shared.schemas import SamplingParams
from worker.engine.api import Engine, EngineRequest, RequestOutput, StepStats
from worker.profile_table import BatchCosts, assemble, mean
from worker.speculation import apply_decision

log = logging.getLogger(__name__)

PROFILE_ID = "nj-profile-"  # prefix of every synthetic request id
LONG_REPS = 3  # rounds of the long-context pass (at most ``reps``)
LONG_COST = 2.5  # a long-context round's time over a short one's: the long pass needs that much budget left
PROFILE_POLICY = "profile"


@dataclass(frozen=True)
class ProfileSettings:
    """How a worker profiles itself (``--no-profile`` turns it off)."""

    enabled: bool = True
    budget_s: float = 60.0  # the whole pass stops here; completed batch sizes are kept
    max_batch: int = 32  # largest batch measured (powers of two up to it, capped by the engine)
    gamma_max: int = 4  # rows per sequence 1 .. gamma_max + 1
    prompt_len: int = 16  # tokens of each synthetic prompt
    long_prompt_len: int = 128  # the target measured again at this prompt length (0: not)
    reps: int = 5  # rounds over the batch sizes, one step per point each (the fastest is kept)
    warmup: int = 1  # γ = 0 steps run, not measured, after the prefill
    lag_steps: int = 2  # γ = 0 steps before another drafter's catch-up is measured

    def __post_init__(self) -> None:
        if not self.budget_s > 0 or self.max_batch < 1 or self.gamma_max < 1 or self.reps < 1:
            raise ValueError("the profile needs a positive budget, max_batch, gamma_max and reps")
        if self.prompt_len < 2 or self.warmup < 0 or self.lag_steps < 0:
            raise ValueError("the profile needs prompt_len ≥ 2 and warmup, lag_steps ≥ 0")

    def output_len(self, drafters: int) -> int:
        """Output tokens one synthetic sequence may need over a batch's pass (each step
        emits at most γ + 1)."""
        plain = self.warmup + 1 + drafters * (self.lag_steps + 2)
        return plain + sum(range(2, self.gamma_max + 2)) + 3 * drafters + 8


class Interrupted(Exception):
    """A real request ran in a profiling step: the pass was abandoned."""

    def __init__(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        super().__init__("a real request arrived while profiling")
        self.outputs, self.stats = outputs, stats


class OutOfTime(Exception):
    """The profiling budget ran out."""


class Stopped(Exception):
    """The worker is stopping (SIGTERM): the pass ends at its next step."""


def busy(stats: StepStats) -> float:
    """The step's time without drafting and catch-up: the target pass and the step's rest."""
    catch = sum(e.seconds for e in stats.switch_costs)
    return max(stats.step_time - stats.draft_time - catch, 0.0)


class _Pass:
    """One profiling pass over an engine (not thread-safe; runs in the engine's thread)."""

    def __init__(
        self,
        engine: Engine,
        s: ProfileSettings,
        deadline: float,
        drafters: list[str],
        waiting: Callable[[], bool] = lambda: False,
        stop: threading.Event | None = None,
    ) -> None:
        self.engine, self.s, self.deadline, self.drafters = engine, s, deadline, drafters
        self.waiting = waiting  # a real job was admitted: stop before the next step
        self.stop = stop  # set from the event loop: the pass ends before its next step
        self.offloaded = not drafters
        self.rng = random.Random(0)
        self.total_blocks = 0
        self.last_step_s = 0.0
        self.vocab = _vocab_size(engine)
        self.output_len = output_room(engine, s, len(drafters))
        self.contexts: list[float] = []  # of the target steps measured in this batch's pass
        self.where = ""  # what the pass measures now, for the progress line
        self.said = time.perf_counter()  # when the last progress line went out

    def decide(self, gamma: int, drafter: str | None = None) -> None:
        table, inf = [(ALL_BATCHES, gamma)], float("inf")
        # No counterfactual scoring: the profile times forwards; what scoring costs a served
        # step is learned from telemetry (planner/policies/prior.py, SpecOverhead).
        d = Decision(version=0, policy=PROFILE_POLICY, gamma_table=table, drafter=drafter, valid_for_s=inf,
                     score_drafters=False)  # fmt: skip
        apply_decision(self.engine, d.model_copy(update={"offload": self.offloaded}))

    def step(self) -> tuple[StepStats, list[RequestOutput]]:
        t0 = time.perf_counter()
        if self.stop is not None and self.stop.is_set():
            raise Stopped
        if t0 + self.last_step_s > self.deadline:  # the next step would end past the budget
            raise OutOfTime
        if self.waiting():  # give the engine back before this step, not after it
            raise Interrupted([], StepStats())
        result = self.engine.step()
        now = time.perf_counter()
        self.last_step_s = now - t0
        foreign = [o for o in result.outputs if not o.request_id.startswith(PROFILE_ID)]
        if foreign:
            raise Interrupted(foreign, result.stats)
        self.total_blocks = result.stats.total_blocks or self.total_blocks
        if now - self.said >= 1.0:  # a line a second: the pass takes up to its budget
            self.said = now
            left = max(self.deadline - now, 0.0)
            log.info("cost profile: %s, %.0f s left of the budget at most", self.where, left)
        return result.stats, result.outputs

    def fill(self, ids: list[str]) -> None:
        """A synthetic request per id, prefilled: every one has its first token."""
        params = SamplingParams(max_tokens=self.output_len, temperature=0.0, ignore_eos=True)
        batch = len(ids)
        for rid in ids:
            prompt = [self.rng.randrange(3, self.vocab) for _ in range(self.s.prompt_len)]
            self.engine.add_request(EngineRequest(rid, prompt, params))
        self.decide(0)
        started: set[str] = set()
        for _ in range(4 * batch + 8):  # prompts are chunked; bounded anyway
            _, outputs = self.step()
            started |= {o.request_id for o in outputs if o.num_output_tokens > 0}
            if started >= set(ids):
                return
        raise RuntimeError(f"the synthetic prompts of batch {batch} never finished prefilling")

    def clear(self, ids: list[str]) -> None:
        """Abort every synthetic request and step until the engine has forgotten them."""
        for rid in ids:
            self.engine.abort_request(rid)
        for _ in range(4):
            if not self.engine.has_unfinished():
                return
            result = self.engine.step()
            foreign = [o for o in result.outputs if not o.request_id.startswith(PROFILE_ID)]
            if foreign:
                raise Interrupted(foreign, result.stats)

    def counted(self, stats: StepStats, batch: int) -> bool:
        return stats.batch_size == batch and stats.prefill_tokens == 0 and not stats.switch_costs

    def plain(self, batch: int, steps: int, skip: int, out: list[float]) -> None:
        """``steps`` steps at γ = 0 (the first ``skip`` not measured); their times into ``out``."""
        self.decide(0)
        for i in range(steps):
            stats, _ = self.step()
            if i >= skip and self.counted(stats, batch) and stats.gamma == 0:
                out.append(busy(stats))
                self.contexts.append(stats.mean_context)

    def measure(self, batch: int, ids: list[str]) -> BatchCosts:
        """One step of each point: γ = 0; the first drafter at γ = 1..γmax; each other drafter
        after ``lag_steps`` γ = 0 steps, at γ = min(2, γmax). The first draft of each pays its
        catch-up (not counted)."""
        s, costs = self.s, BatchCosts()
        self.fill(ids)
        rows: dict[int, list[float]] = defaultdict(list)
        drafts: dict[str, list[float]] = defaultdict(list)
        self.plain(batch, s.warmup + 1, s.warmup, rows[1])
        for j, name in enumerate(self.drafters):
            if j:  # every drafter falls behind at γ = 0, so its catch-up shows
                self.plain(batch, s.lag_steps, 0, rows[1])
            self.decide(1, name)
            stats, _ = self.step()
            events = [e for e in stats.switch_costs if e.drafter == name and e.tokens > 0]
            costs.catch_up[name] = sum(e.seconds for e in events) / max(sum(e.tokens for e in events), 1)
            full = any(len(rows[q]) for q in range(2, s.gamma_max + 2))
            gammas = [min(2, s.gamma_max)] if full else list(range(1, s.gamma_max + 1))
            for gamma in gammas:
                self.decide(gamma, name)
                stats, _ = self.step()
                if not self.counted(stats, batch) or stats.drafter != name:
                    continue
                drafts[name].append(stats.draft_time / gamma)
                if not full and stats.gamma == gamma and stats.proposed == batch * gamma:
                    rows[gamma + 1].append(busy(stats))
                    self.contexts.append(stats.mean_context)
        self.clear(ids)
        costs.context = mean(self.contexts)
        self.contexts.clear()
        costs.target = {q: min(xs) for q, xs in sorted(rows.items()) if xs}
        costs.drafter = {n: min(xs) for n, xs in drafts.items() if xs}
        return costs


def batch_sizes(engine: Engine, s: ProfileSettings, drafters: int) -> list[int]:
    """Powers of two up to ``max_batch``, the engine's sequence limit and what its KV pool
    holds of synthetic sequences."""
    cap = s.max_batch
    config = getattr(engine, "config", None)
    cap = min(cap, getattr(config, "max_num_seqs", cap))
    blocks = getattr(getattr(engine, "blocks", None), "num_blocks", 0)
    block_size = getattr(config, "block_size", 0)
    if blocks and block_size:
        tokens = s.prompt_len + output_room(engine, s, drafters) + s.gamma_max + 1
        cap = min(cap, max(1, (blocks - 1) // (-(-tokens // block_size) + 1)))
    sizes, b = [], 1
    while b <= cap:
        sizes.append(b)
        b *= 2
    return sizes


def _vocab_size(engine: Engine) -> int:
    config = getattr(getattr(engine, "runner", None), "config", None)
    return max(int(getattr(config, "vocab_size", 0) or 0), 16)


def output_room(engine: Engine, s: ProfileSettings, drafters: int) -> int:
    """Output tokens a synthetic sequence may take: what a batch's pass needs, within the
    engine's context."""
    limit = engine.max_model_len or 4096
    return max(1, min(s.output_len(drafters), limit - s.prompt_len - 1))


def profile_engine(
    engine: Engine,
    model: str,
    settings: ProfileSettings = ProfileSettings(),
    *,
    worker_id: str | None = None,
    offloaded: bool = False,
    restore: Callable[[], Decision | None] | None = None,
    source: str = "startup",
    waiting: Callable[[], bool] = lambda: False,
    stop: threading.Event | None = None,
) -> CostProfile | None:
    """Measure ``engine`` (idle, in the thread that steps it); None when not even batch 1
    finished within the budget. ``restore()`` is applied at the end (the decision in force);
    ``offloaded``: the drafters are away, so only γ = 0 (q = 1) can be measured.

    Raises ``Interrupted`` when ``waiting()`` turns true (no outputs) or a step also ran a
    request that is not the profiler's (its outputs), and ``Stopped`` (its synthetic requests
    cleared) once ``stop`` is set: within one step."""
    t0 = time.perf_counter()
    names = [] if offloaded else list(getattr(engine, "drafter_names", []))
    run = _Pass(engine, settings, t0 + settings.budget_s, names, waiting, stop)
    done: dict[int, BatchCosts] = {}
    long: dict[int, BatchCosts] = {}
    try:
        sizes = batch_sizes(engine, settings, len(names))
        first = min(settings.reps, LONG_REPS)
        _rounds(run, sizes, first, done, "", t0)
        per_round = (time.perf_counter() - t0) / first
        if (
            settings.long_prompt_len > settings.prompt_len
            and done
            and (time.perf_counter() + LONG_COST * per_round < run.deadline)
        ):
            # The target again at a longer context (the first drafter only, for the rows),
            # before the last rounds of the short one: a slow model spends its budget on both.
            wide = replace(settings, prompt_len=settings.long_prompt_len)
            again = _Pass(engine, wide, run.deadline, names[:1], waiting, stop)
            long_sizes = [b for b in batch_sizes(engine, wide, len(names[:1])) if b in done]
            _rounds(again, long_sizes, first, long, "long-", t0)
        _rounds(run, sizes, settings.reps - first, done, "", t0, start=first)
    finally:
        apply_decision(engine, (restore() if restore else None) or _idle_decision())
    seconds = time.perf_counter() - t0
    profile = assemble(done, model, names, seconds, run.total_blocks, worker_id, source, long)
    if profile is not None:
        profile.device = _device(engine)
        profile.weights = engine.weights  # what it measured is what is served: the precision
    return profile


def _rounds(
    run: _Pass, sizes: list[int], reps: int, done: dict[int, BatchCosts], tag: str, t0: float, start: int = 0
) -> None:
    """``reps`` rounds (numbered from ``start``) over the batch sizes into ``done`` (the
    fastest of each point kept), until the budget runs out."""
    for rnd, batch in ((r, b) for r in range(start, start + reps) for b in sizes):
        ids = [f"{PROFILE_ID}{tag}{rnd}-{batch}-{i}" for i in range(batch)]
        run.where = f"{tag}round {rnd + 1} of at most {run.s.reps}, batch {batch}"
        try:
            done[batch] = run.measure(batch, ids).fastest(done.get(batch))
            if batch == sizes[-1]:
                log.info("cost profile: %sround %d done at %.1f s", tag, rnd + 1, time.perf_counter() - t0)
        except OutOfTime:
            log.warning("cost profile: budget spent in %sround %d at batch %d", tag, rnd + 1, batch)
            run.clear(ids)
            return
        except Stopped:
            run.clear(ids)
            raise
        except Interrupted:
            for rid in ids:  # the next real step finishes them, as cancelled
                run.engine.abort_request(rid)
            raise


def _idle_decision() -> Decision:
    return Decision(version=0, policy=PROFILE_POLICY, valid_for_s=float("inf"), note="profile done")


def _device(engine: Engine) -> str:
    config = getattr(engine, "config", None)
    try:
        return str(config.torch_device()) if config is not None else "cpu"
    except AttributeError:
        return "cpu"
