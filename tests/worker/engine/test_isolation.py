"""A request that makes the engine fail fails alone, with a typed error; its batch mates
finish exactly as they would have without it (greedy, token for token)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.control import ALL_BATCHES, Decision
from shared.errors import ErrorCode
from shared.schemas import SamplingParams
from tests.worker.engine.drive import Run, drive
from tests.worker.engine.prompts import NEW, PROMPTS
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.engine.records import Candidate, Drafted
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence
from worker.engine.spec.drafter import Proposal
from worker.speculation import apply_decision

GREEDY = SamplingParams(max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def refs(llama_dir: Path) -> list[list[int]]:
    hf = hf_model(llama_dir)
    return [hf_greedy(hf, p, NEW, stop_at_eos=False) for p in PROMPTS[:5]]


def batch_with_poison() -> list[EngineRequest]:
    return [EngineRequest(str(i), PROMPTS[i], GREEDY) for i in range(3)] + [
        EngineRequest("poison", PROMPTS[3], GREEDY)
    ]


def poison_forward(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, when: Callable[[Sequence], bool]
) -> None:
    """Make the target forward raise whenever the poison request is in it and ``when`` holds."""
    forward = engine.forward

    def run(scheduled: list[Scheduled], drafts: dict[str, Drafted]) -> list[Candidate]:
        if any(s.seq.request_id == "poison" and when(s.seq) for s in scheduled):
            raise RuntimeError("poisoned forward")
        return forward(scheduled, drafts)

    monkeypatch.setattr(engine, "forward", run)


def check(run: Run, refs: list[list[int]], poison_tokens: list[int]) -> None:
    for i in range(3):
        assert run.tokens[str(i)] == refs[i], f"batch mate {i} changed"
        assert run.finals[str(i)].finish_reason == "length"
    final = run.finals["poison"]
    assert final.finish_reason == "error" and final.error_code is ErrorCode.ENGINE_ERROR
    assert final.error is not None and "RuntimeError" in final.error
    assert run.tokens.get("poison", []) == poison_tokens
    assert run.total("failed") == 1


def test_a_request_that_breaks_the_forward_fails_alone(
    llama_dir: Path,
    refs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=256, ngram=False)
    poison_forward(engine, monkeypatch, lambda seq: True)
    run = drive(engine, batch_with_poison())
    check(run, refs, [])
    assert not engine.has_unfinished()
    # The engine goes on serving.
    again = drive(engine, [EngineRequest("later", PROMPTS[4], GREEDY)])
    assert again.tokens["later"] == refs[4]


def test_failing_mid_generation_keeps_what_was_sent(
    llama_dir: Path,
    refs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=256, ngram=False)
    poison_forward(engine, monkeypatch, lambda seq: seq.num_output >= 5)
    run = drive(engine, batch_with_poison(), per_step=1)
    check(run, refs, refs[3][:5])


def test_a_request_that_breaks_the_drafter_fails_alone(
    llama_dir: Path,
    refs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poison passes its prefill alone (no drafts there) and fails at its first draft."""
    engine = load_engine(llama_dir, block_size=4, num_blocks=256)
    assert engine.spec.pool is not None
    ngram = engine.spec.pool.drafters["ngram"]
    propose = ngram.propose

    def poisoned(seqs: list[Sequence], ks: list[int]) -> Proposal:
        if any(s.request_id == "poison" for s in seqs):
            raise RuntimeError("poisoned drafter")
        return propose(seqs, ks)

    monkeypatch.setattr(ngram, "propose", poisoned)
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 2)], drafter="ngram")
    )
    run = drive(engine, batch_with_poison())
    # Its first token came from the batch's prefill, its second from its own (recompute)
    # prefill as a suspect; its first draft then failed alone.
    check(run, refs, refs[3][:2])
    assert run.total("proposed") > 0


@pytest.mark.parametrize("validated", [True, False])
def test_a_vanishing_temperature_samples(llama_dir: Path, validated: bool) -> None:
    """temperature 1e-300 is 0 in float32: the sampler floors it instead of dividing by zero
    (whether or not SamplingParams' own validator already raised it), with and without drafts."""
    fields: dict[str, Any] = dict(temperature=1e-300, max_tokens=8, seed=3, ignore_eos=True)
    params = SamplingParams(**fields) if validated else SamplingParams.model_construct(None, **fields)
    assert not params.greedy
    engine = load_engine(llama_dir, block_size=4, num_blocks=64)
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 2)], drafter="ngram")
    )
    run = drive(
        engine, [EngineRequest("tiny", PROMPTS[0], params), EngineRequest("greedy", PROMPTS[1], GREEDY)]
    )
    assert run.finals["tiny"].finish_reason == "length" and len(run.tokens["tiny"]) == 8
    assert run.total("failed") == 0


def test_a_constraint_that_fails_in_a_step_is_the_request_s_fault(
    llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GrammarError raised by a step (the grammar engine gave up on the request's
    constraint) ends the request with bad_request (a 400), never engine_error (a 500)."""
    from worker.engine.grammar import GrammarError

    engine = load_engine(llama_dir, block_size=4, num_blocks=256, ngram=False)
    forward = engine.forward

    def run(scheduled: list[Scheduled], drafts: dict[str, Drafted]) -> list[Candidate]:
        if any(s.seq.request_id == "poison" for s in scheduled):
            raise GrammarError("the grammar failed: too many lexer states")
        return forward(scheduled, drafts)

    monkeypatch.setattr(engine, "forward", run)
    got = drive(engine, batch_with_poison())
    final = got.finals["poison"]
    assert final.finish_reason == "error" and final.error_code is ErrorCode.BAD_REQUEST
    assert final.error is not None and "too many lexer states" in final.error
    assert all(got.finals[str(i)].finish_reason == "length" for i in range(3))
