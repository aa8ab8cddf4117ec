"""Helpers that feed an engine and collect what it reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.engine.api import Engine, EngineRequest, RequestOutput, StepStats


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finals: dict[str, RequestOutput] = field(default_factory=dict)
    stats: list[StepStats] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(int(getattr(s, name)) for s in self.stats)


def check_outcomes(out: RequestOutput) -> None:
    """An output's draft outcomes account for exactly its new tokens, each step's accepted
    drafts first and at most one target token after them."""
    assert sum(o.tokens for o in out.outcomes) == len(out.new_token_ids), (out.outcomes, out.new_token_ids)
    for o in out.outcomes:
        assert 0 <= o.accepted <= min(o.drafted, o.tokens) and o.tokens <= o.accepted + 1, o
        assert o.drafted <= o.gamma and (o.drafter is not None or o.drafted == 0), o


def drive(engine: Engine, requests: list[EngineRequest], per_step: int = 0, max_steps: int = 10_000) -> Run:
    """Add ``per_step`` requests before each step (0: all up front) and step until done."""
    pending = list(requests)
    run = Run()
    for _ in range(max_steps):
        take = len(pending) if per_step == 0 else per_step
        for req in pending[:take]:
            engine.add_request(req)
        del pending[:take]
        if not pending and not engine.has_unfinished():
            return run
        result = engine.step()
        run.stats.append(result.stats)
        for out in result.outputs:
            check_outcomes(out)
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                assert out.request_id not in run.finals, f"{out.request_id} finished twice"
                run.finals[out.request_id] = out
    raise AssertionError("the engine did not finish")
