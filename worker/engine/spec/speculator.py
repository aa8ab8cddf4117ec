"""The engine's speculation, step by step: γ and drafter, drafting, rollback, feedback.

Per step the engine asks ``choose`` for a ``SpecChoice``: under a plan with step costs, each
decoding sequence's own (drafter, γ) by the cost rule (plan.py: least predicted time per token
at the sequence's acceptance, its prompt scored by every drafter before its first draft);
otherwise one γ for all (``SpeculationPlan.gamma_for`` at the batch size of decoding
sequences) and the plan's drafter. γ is capped at ``max_gamma``, and 0 without a plan,
without drafters, or while the draft is not resident. The scheduler reserves each sequence's γ
slots, then ``draft`` returns each sequence's drafts (the sequences do not hold them; the
target forward feeds them). After the one target forward and verification, commit appends
the drafts that stand and ``rollback`` drops the rejected ones from every drafter, and
``feedback`` computes the acceptance of the active drafter (realised) and, where the plan
asks for it (``SpeculationPlan.score_drafters``: a policy that learns over the drafters), of every
other one (counterfactual) for telemetry — but those the planner found dominated
(``SpeculationPlan.skip_drafters``); a fixed drafter costs no other drafter's forward. Under
the cost rule a new sequence's prompt is scored by every drafter that could pay, and a
sequence that ran γ = 0 now and then (within a share of the step's time) by the model drafters
that could pay, on its last tokens (scoring.py).

Where nothing pays, a policy runs γ = 0 and now and then one speculative step (exploring).
Such a step already pays the catch-up of the drafters that draft (every position they missed,
prompts of sequences that arrived meanwhile included); scoring every other drafter on it would
make each of them catch up too, for one step's counterfactual. So the first speculative step
after γ = 0 scores nobody: scoring starts with the second one in a row, when speculation is
seen to stay on (``Feedback.deferred``).

A catch-up is reported as a ``SwitchCostEvent`` (what the planner charges for turning
speculation back on, and removes from the step's time) only where speculation resumes after
γ = 0 or the batch's drafter changes. While drafters share the steps (per-request scope) each
of them also catches up at every speculative step on what it has not seen — a new sequence's
prompt, an accepted last draft — which only speculating costs: that stays in the step's time,
so the bandit weighs it against plain decoding.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from shared.control import Lookahead
from shared.experts import ExpertLearner
from worker.engine.records import Drafted, DraftRound, Verified
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Drafter
from worker.engine.spec.lookahead import DEPTH, LookaheadJudge
from worker.engine.spec.memory import ElasticMemory
from worker.engine.spec.model_drafter import ModelDrafter
from worker.engine.spec.ngram import NgramDrafter
from worker.engine.spec.plan import CostRule
from worker.engine.spec.pool import DrafterPool, pooled
from worker.engine.spec.router import DrafterChoice, shared_costs
from worker.engine.spec.scoring import SequenceScores
from worker.engine.spec.speculation_plan import SpeculationPlan


@dataclass
class Feedback:
    """Acceptance of the step's drafts, realised and counterfactual."""

    accepted: int = 0
    counterfactual: dict[str, float] = field(default_factory=dict)  # drafter -> acceptance rate
    seconds: float = 0.0  # counterfactual scoring
    drafts: int = 0  # sequences whose drafts were verified
    per_pos: list[int] = field(default_factory=list)  # accepted drafts at each draft position
    deferred: bool = False  # the first speculative step after γ = 0: no counterfactual scored
    lookahead: dict[str, Lookahead] = field(default_factory=dict)  # model-free drafters, every step


@dataclass
class SpecChoice:
    """What one step speculates (choose → schedule → draft)."""

    gamma: int = 0  # the largest γ of the step (0: nothing is drafted)
    drafter: Drafter | None = None  # batch scope: everyone's; cost rule: the most sequences'
    lookahead: dict[str, int] | None = None  # cost rule: γ per request id (None: ``gamma`` for all)
    drafters: dict[str, str] = field(default_factory=dict)  # cost rule: drafter per request id
    prompt_seconds: float = 0.0  # scoring new sequences' prompts (cost rule)
    prompts_scored: int = 0

    @property
    def slots(self) -> int | dict[str, int]:
        """What the scheduler reserves after each decoding sequence."""
        return self.lookahead if self.lookahead is not None else self.gamma


class Speculator:
    def __init__(self, pool: DrafterPool | None, memory: ElasticMemory, max_gamma: int) -> None:
        self.pool, self.memory, self.max_gamma = pool, memory, max_gamma
        self._plan: SpeculationPlan | None = None  # of the step being drafted: its drafter scope
        self._rule: CostRule | None = None  # the cost rule of ``_plan`` (None: it has none)
        self._active = False  # speculative work may pay this step (features, lookahead judge)
        self._idle = False  # the last decoding step ran γ = 0 (the drafters fell behind)
        self._resumed = False  # this step drafts right after γ = 0: its feedback scores nobody
        self._unpaying: frozenset[str] = frozenset()  # drafters that cannot pay at this batch size
        # the prompt prior and the γ = 0 scores (scoring.py)
        self.scores = SequenceScores(pool, self.reset) if pool is not None else None
        free = [d for d in pool.drafters.values() if isinstance(d, NgramDrafter)] if pool else []
        self.judge = LookaheadJudge(free, min(DEPTH, max_gamma)) if free and max_gamma > 0 else None

    def choose(self, plan: SpeculationPlan | None, decoding: list[Sequence], running: int) -> SpecChoice:
        """γ and drafter for the step's ``decoding`` sequences (``running``: the batch being
        formed, prefilling and waiting sequences included: the cost rule gates speculative work
        at it, so a prompt prefilled for a busy batch hands no features over)."""
        if plan is not self._plan:
            self._plan = plan
            self._rule = CostRule(plan) if plan is not None and plan.step_costs else None
        if self.pool is None or plan is None or not self.memory.resident:
            self._active = self.pool is not None and self.memory.resident  # as before any rule
            return SpecChoice()
        if self._rule is not None:
            return self._by_cost(self._rule, decoding, running)
        self._active = True
        gamma = max(0, min(plan.gamma_for(len(decoding)), self.max_gamma)) if decoding else 0
        return SpecChoice(gamma, self.pool.resolve(plan.drafter)) if gamma else SpecChoice()

    def _by_cost(self, rule: CostRule, decoding: list[Sequence], running: int) -> SpecChoice:
        """Each decoding sequence's pair by the cost rule; nothing at all where no drafter can
        pay at this batch size (no prompt scored, no features, no lookahead)."""
        assert self.pool is not None and self._plan is not None
        skip = self._plan.skip_drafters
        allowed = [d for d in rule.drafters if d in self.pool.drafters and d not in skip]
        gate = max(len(decoding), running, 1)
        # Only the drafters that could pay at this batch size are scored, on prompts and
        # counterfactually: the others are not chosen here, and a model drafter's score is a
        # forward over what it has not seen (at 32 users on nj-target, 1–3 ms of a 20 ms step).
        payers = [d for d in allowed if rule.could_pay(gate, [d])]
        self._active = bool(payers)
        if not self._active or not decoding:
            return SpecChoice()
        self._unpaying = frozenset(allowed) - frozenset(payers)
        out = SpecChoice(lookahead={})
        new = [s for s in decoding if not s.spec.prompt_scored]
        if new:
            t0 = time.perf_counter()
            assert self.scores is not None
            self.scores.prompts(new, payers, rule.prior)
            out.prompt_seconds, out.prompts_scored = time.perf_counter() - t0, len(new)
        assert out.lookahead is not None
        batch = len(decoding)
        usable = [d for d in self.pool.drafters.values() if d.name in allowed]
        free = [d for d in usable if isinstance(d, NgramDrafter)]
        models = [d for d in usable if isinstance(d, ModelDrafter)]  # heads too: lag = pending features
        for seq in decoding:
            proposals = {d.name: d.proposal_length(seq, rule.gamma_max) for d in free}
            lags = {d.name: d.lag(seq) for d in models}
            name, gamma = rule.choose(seq.spec, batch, allowed, proposals, lags)
            gamma = min(gamma, self.max_gamma)
            if name is not None and gamma > 0:
                out.lookahead[seq.request_id], out.drafters[seq.request_id] = gamma, name
        if out.drafters:
            shares = Counter(out.drafters.values())
            out.drafter = self.pool.drafters[max(sorted(shares), key=lambda n: shares[n])]
            out.gamma = max(out.lookahead.values())
        return out

    def _plain_scores(
        self, plain: list[Verified], batch: int
    ) -> tuple[list[dict[str, tuple[float, int]]], float] | None:
        """Cost rule: the model drafters that could pay scored on the last tokens of the
        decoding sequences that ran γ = 0 (of ``batch``), now and then (scoring.py). None:
        nothing scored."""
        if self.scores is None or not self._active or not plain:
            return None
        if self._rule is None or self._plan is None:
            return None
        assert self.pool is not None
        skip = self._unpaying | frozenset(self._plan.skip_drafters)
        names = [
            n
            for n in self._rule.drafters
            if isinstance(self.pool.drafters.get(n), ModelDrafter) and n not in skip
        ]
        return self.scores.plain([v.seq for v in plain], names, self._rule.plain(batch))

    @property
    def per_request(self) -> bool:
        d, pool = self._plan, self.pool
        return d is not None and d.drafter_scope == "request" and pool is not None and len(pool.drafters) > 1

    @property
    def scores_drafters(self) -> bool:
        """Whether this step's plan asks for every drafter's counterfactual acceptance."""
        return self._plan is None or self._plan.score_drafters

    def draft(self, choice: SpecChoice, scheduled: list[Scheduled]) -> DraftRound:
        """Drafts for every decoding sequence, returned (the sequences do not hold them: the
        target forward feeds them after each one's last token, commit appends those that
        stand): all by the choice's drafter, in per-request scope each group by its own
        (router.py), under the cost rule each sequence by its own. The drafters' own caches
        advance here (catch-up and proposal forwards); ``rollback`` in commit cuts them back."""
        decoding = [s for s in scheduled if not s.prefill]
        if self.pool is None or not decoding:
            return DraftRound()
        drafter = choice.drafter
        if drafter is None:
            self.pool.last_active = None  # γ = 0 ran: every drafter falls behind
            self._idle, self._resumed = True, False
            return DraftRound()
        self._resumed, self._idle = self._idle, False
        if choice.lookahead is not None:
            groups = self._by_drafter(choice, decoding)
        else:
            groups = self._groups(drafter, decoding)
        out = DraftRound()
        shared = len(groups) > 1 or self.per_request or choice.lookahead is not None
        for name, group in groups.items():
            d = self.pool.drafters[name]
            seqs = [s.seq for s in group]
            switch = self.pool.catch_up(d, seqs, always=shared)
            # A switch cost only where speculation resumes or the drafter changes; otherwise
            # (drafters sharing steps) it is what every speculative step costs: the prompts of
            # new sequences, the last accepted draft, and it stays in the step's own time.
            if switch is not None and (self._resumed or not shared):
                out.switch_costs.append(switch)
            t0 = time.perf_counter()
            proposal = d.propose(seqs, [s.num_lookahead for s in group])
            for s, tokens, q in zip(group, proposal.tokens, proposal.probs, strict=True):
                if s.seq.grammar is not None and (q is None or s.seq.keyed):  # exact cut: grammar.py
                    tokens = tokens[: s.seq.grammar.fitting(tokens)]
                out.drafts[s.seq.request_id] = Drafted(len(s.seq.token_ids), tokens, q, s.num_lookahead, name)
            out.seconds += time.perf_counter() - t0
            out.shares[name] = len(group)
        if not out.shares:  # no sequence had room for a draft
            return out
        out.drafter = max(sorted(out.shares), key=lambda n: out.shares[n])
        # A later batch-scope step catches its drafter up unless it alone drafted this one.
        self.pool.last_active = out.drafter if len(groups) == 1 else None
        return out

    @staticmethod
    def _by_drafter(choice: SpecChoice, decoding: list[Scheduled]) -> dict[str, list[Scheduled]]:
        """Cost rule: the sequences with draft slots, per the drafter each chose."""
        groups: dict[str, list[Scheduled]] = {}
        for s in decoding:
            name = choice.drafters.get(s.seq.request_id)
            if name is not None and s.num_lookahead > 0:
                groups.setdefault(name, []).append(s)
        return groups

    def _groups(self, drafter: Drafter, decoding: list[Scheduled]) -> dict[str, list[Scheduled]]:
        """The decoding sequences per drafter that drafts for them this step."""
        if not self.per_request:
            return {drafter.name: decoding}
        assert self.pool is not None and self._plan is not None
        groups: dict[str, list[Scheduled]] = {}
        for s in decoding:
            c = s.seq.drafter_choice
            if c is None or c.current not in self.pool.drafters:
                learner = ExpertLearner(self._plan.request_learner, self._plan.request_discount)
                c = s.seq.drafter_choice = DrafterChoice(learner, drafter.name)
            elif c.current in self._plan.skip_drafters:  # dominated now: the planner's choice
                c.current = drafter.name
            groups.setdefault(c.current, []).append(s)
        return groups

    def _costs(self) -> dict[str, float]:
        return dict(self._plan.drafter_costs) if self._plan is not None else {}

    @staticmethod
    def _preference(v: Verified, costs: dict[str, float]) -> str:
        """The drafter a drafted sequence's own rates favour (router.shared_costs groups by it)."""
        assert v.drafted is not None
        choice = v.seq.drafter_choice
        return v.drafted.drafter if choice is None else choice.preferred(v.drafted.requested, costs)

    def _wants_scores(self, seq: Sequence) -> bool:
        if self._rule is not None:
            return seq.spec.wants_scores()
        choice = seq.drafter_choice
        return not self.per_request or choice is None or choice.wants_scores()

    def wants_features(self) -> bool:
        """Whether this step's target forward hands over its last hidden states: only while
        a feature drafter is in the pool and resident (at γ = 0 too: catch-up reads them)."""
        return self.pool is not None and bool(self.pool.features) and self.memory.resident and self._active

    def observe(self, seq_id: str, start: int, rows: torch.Tensor) -> None:
        """The target's features of positions ``start ..`` of a sequence, for feature drafters."""
        assert self.pool is not None
        for d in self.pool.features:
            d.observe(seq_id, start, rows)

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        if self.pool is not None:
            self.pool.rollback(seq_id, num_tokens)

    def free(self, seq_id: str) -> None:
        if self.pool is not None:
            self.pool.free(seq_id)
        if self.judge is not None:
            self.judge.free(seq_id)

    def reset(self) -> None:
        """Drop every drafter's per-sequence state (each catches up at its next draft)."""
        if self.pool is not None:
            self.pool.reset()
        if self.judge is not None:
            self.judge.reset()

    def feedback(self, drafter: Drafter | None, verified: list[Verified]) -> Feedback:
        """Realised acceptance of the drafters that drafted and, when due, every other
        drafter's counterfactual acceptance on the same verified tokens; in per-request
        scope each sequence's learner learns from its own (router.py)."""
        drafted = [v for v in verified if v.drafted is not None]
        # Model-free drafters are judged on every step, γ = 0 included (lookahead.py).
        judge = self.judge if self._active and (self.scores_drafters or self._rule is not None) else None
        each = judge.judge_each([v.seq for v in verified]) if judge is not None else {}
        lookahead = judge.histograms(each) if judge is not None else {}
        if self._rule is not None and judge is not None:  # each sequence's own n-gram runs (plan.py)
            for v in verified:
                for name, x in each.get(v.seq.request_id, {}).items():
                    v.seq.spec.judged(name, x.hit, x.proposed, judge.depth)
        decoding = [v for v in verified if not v.candidate.scheduled.prefill]
        at_zero = self._plain_scores([v for v in decoding if v.drafted is None], len(decoding))
        if self.pool is None or drafter is None or not drafted:
            if at_zero is None:
                return Feedback(lookahead=lookahead)
            return Feedback(counterfactual=pooled(at_zero[0]), seconds=at_zero[1], lookahead=lookahead)
        accepted = 0
        counts: list[dict[str, tuple[float, int]]] = []  # per sequence: drafter -> (accepted, judged)
        for v in drafted:
            assert v.drafted is not None
            k = len(v.drafted.tokens)
            accepted += len(v.emitted) - 1
            # Drafts judged: up to and including the first rejected one; a sequence that asked
            # for drafts and got none counts one miss, as the counterfactual would.
            judged = min(len(v.emitted), k) if k else int(v.drafted.requested > 0)
            counts.append({v.drafted.drafter: (len(v.emitted) - 1.0, judged)})
        seconds, deferred = 0.0, self._resumed
        self._resumed = False
        scoring = not deferred and self.scores_drafters and self.pool.due()
        # In per-request scope a sequence whose learner has settled is scored only now and
        # then (router.py); in batch scope every sequence feeds the planner's learner.
        scored = [i for i, v in enumerate(drafted) if scoring and self._wants_scores(v.seq)]
        if scored:
            t0 = time.perf_counter()
            part = [drafted[i] for i in scored]
            starts = [v.drafted.start for v in part if v.drafted is not None]
            actives = [v.drafted.drafter for v in part if v.drafted is not None]
            skip = self._plan.skip_drafters if self._plan is not None else frozenset()
            if self._rule is not None:  # the cost rule: none that cannot pay at this batch size
                skip = skip | self._unpaying
            seqs, p_rows = [v.seq for v in part], [v.p for v in part]
            hits = self.pool.counterfactual_hits(actives, seqs, starts, p_rows, skip)
            for i, h in zip(scored, hits, strict=True):
                counts[i] = counts[i] | h
            seconds = time.perf_counter() - t0
        if self._rule is not None:  # the cost rule: each sequence's own acceptance per drafter
            for v, c in zip(drafted, counts, strict=True):
                v.seq.spec.learn(c)
        elif self.per_request:  # full information: every drafter's rate on its own positions
            learnt = set(scored)
            plain = self._costs()
            # what each sequence favours, for the shared costs: only on steps where one learns
            prefs = [self._preference(v, plain) for v in drafted] if learnt else []
            groups = Counter(prefs)
            for i, v in enumerate(drafted):
                choice = v.seq.drafter_choice
                if choice is not None and i in learnt:
                    assert v.drafted is not None
                    costs = shared_costs(plain, groups, prefs[i], len(drafted))
                    choice.learn(counts[i], v.drafted.requested, costs)
                elif choice is not None:
                    choice.skip()
        if at_zero is not None:
            counts, seconds = counts + at_zero[0], seconds + at_zero[1]
        rates = pooled(counts)
        per_pos = [0] * max((len(v.drafted.tokens) for v in drafted if v.drafted is not None), default=0)
        for v in drafted:
            for pos in range(min(len(v.emitted) - 1, len(per_pos))):
                per_pos[pos] += 1
        return Feedback(accepted, rates, seconds, len(drafted), per_pos, deferred, lookahead)
