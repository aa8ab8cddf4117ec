"""The lookahead judge: what n-gram would have accepted, judged on verified text at every step."""

from __future__ import annotations

import random
from pathlib import Path

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.sequence import Sequence
from worker.engine.spec.lookahead import LookaheadJudge
from worker.engine.spec.ngram import NgramDrafter, ngram_propose
from worker.speculation import apply_decision


def _brute(tokens: list[int], prompt: int, depth: int, positions: list[int]) -> tuple[list[int], list[int]]:
    accepted, proposed = [0] * (depth + 1), [0] * (depth + 1)
    for j in positions:
        prop = ngram_propose(tokens[:j], depth)
        hit = 0
        while hit < len(prop) and prop[hit] == tokens[j + hit]:
            hit += 1
        accepted[hit] += 1
        proposed[len(prop)] += 1
    return accepted, proposed


def test_every_position_is_judged_once_as_the_scan_would() -> None:
    """Growing a sequence one token a step (γ = 0) judges each position once, ``depth`` tokens
    after it was generated, exactly as ``ngram_propose`` on the prefix would have drafted."""
    rng = random.Random(1)
    tokens = [rng.randrange(5) for _ in range(120)]
    prompt, depth = 10, 3
    judge = LookaheadJudge([NgramDrafter()], depth)
    seq = Sequence("s", tokens[:prompt], SamplingParams(), token_ids=tokens[: prompt + 1])
    acc, prop = [0] * (depth + 1), [0] * (depth + 1)
    for n in range(prompt + 1, len(tokens) + 1):
        seq.token_ids = tokens[:n]
        for la in judge.judge([seq]).values():
            acc = [a + b for a, b in zip(acc, la.accepted, strict=True)]
            prop = [a + b for a, b in zip(prop, la.proposed, strict=True)]
    positions = list(range(prompt + 1, len(tokens) - depth + 1))
    assert (acc, prop) == _brute(tokens, prompt, depth, positions)
    judge.free("s")
    assert not judge._index and not judge._next


def test_a_speculative_step_judges_only_its_newest_ready_position_and_few_are_followed() -> None:
    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    judge = LookaheadJudge([NgramDrafter()], depth=2, max_sequences=2)
    seqs = [Sequence(f"s{i}", tokens[:2], SamplingParams(), token_ids=list(tokens)) for i in range(3)]
    first = judge.judge(seqs)["ngram"]
    assert sum(first.accepted) == 2 and first.accepted[2] == 2  # the repeating text: both lead
    assert set(judge._next) == {"s0", "s1"} and judge._next["s0"] == len(tokens) - 2 + 1
    assert judge.judge(seqs) == {}  # nothing new
    judge.free("s0")  # finished: gone from the batch
    seqs = seqs[1:]
    for s in seqs:
        s.token_ids.append(1)
    again = judge.judge(seqs)["ngram"]
    assert sum(again.accepted) == 2 and set(judge._next) == {"s1", "s2"}  # s2 took s0's place


def test_engine_reports_lookahead_at_gamma_zero_only_when_the_decision_scores(
    spec_models: dict[str, Path],
) -> None:
    """Telemetry carries the n-gram's lookahead on γ = 0 steps of a policy that learns over
    the drafters; a static policy (``score_drafters=False``) pays nothing for it."""
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]

    def run(score: bool) -> tuple[int, list[int]]:
        engine = load_engine(spec_models["target"], drafters=[], ngram=True, block_size=4, num_blocks=256)
        table = [(ALL_BATCHES, 0)]
        apply_decision(engine, Decision(version=1, policy="t", gamma_table=table, score_drafters=score))
        params = SamplingParams(max_tokens=24, temperature=0.0)
        reqs = [EngineRequest(f"r{i}", prompt, params) for i in range(2)]
        done = drive(engine, reqs)
        judged = [s.lookahead["ngram"] for s in done.stats if "ngram" in s.lookahead]
        assert all(s.gamma == 0 for s in done.stats)
        totals = [sum(c) for c in zip(*(la.accepted for la in judged), strict=True)]
        return len(judged), totals

    count, accepted = run(True)
    assert count > 0 and sum(accepted) == 2 * (24 - 1 - 4 + 1)  # every output position with 4 after it
    assert run(False) == (0, [])
