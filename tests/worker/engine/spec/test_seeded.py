"""A seeded sampled request is invariant to speculation (worker/engine/keyed.py): the same text
at γ 0, 2 and 4 with every kind of drafter (model drafters — a copy of the target, its first
layer, a random one —, the n-gram drafter, a feature head), under a random γ / drafter /
offload schedule, with preemption forced by a tiny KV pool, and when resumed from a partial
output through the worker's failover path (prompt + the tokens sent) — and it is the text the
target alone draws with that seed (transformers' logits, keyed at each output position)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.control import ALL_BATCHES, Decision
from shared.schemas import JobRequest, SamplingParams
from tests.tiny_models import build_tokenizer
from tests.worker.engine.drive import Run, drive
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.drafting import make_drafter
from tests.worker.engine.spec.feature_heads import trained_head
from tests.worker.engine.spec.references import scheduled_run
from tests.worker.engine.tiny import hf_model
from worker.engine.api import EngineRequest
from worker.engine.keyed import keyed_draw
from worker.engine.loader import load_engine
from worker.engine.processors import process_rows
from worker.engine.sampler import filtered_probs
from worker.engine.sequence import Sequence
from worker.job_run import JobRun, Resume
from worker.speculation import apply_decision

NEW = 20
# Plain temperature, top-k, top-p, and processors (penalties, min_tokens, logit_bias) in front.
KINDS = [
    SamplingParams(max_tokens=NEW, temperature=1.0, ignore_eos=True),
    SamplingParams(max_tokens=NEW, temperature=0.7, top_k=12, ignore_eos=True),
    SamplingParams(max_tokens=NEW, temperature=1.3, top_p=0.8, ignore_eos=True),
    SamplingParams(
        max_tokens=NEW,
        temperature=1.0,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        repetition_penalty=1.3,
        min_tokens=NEW,
        logit_bias={7: 3.0},
    ),
]
PROCESSED = KINDS[3]


def requests(n: int = 12) -> list[EngineRequest]:
    return [
        EngineRequest(str(i), PROMPTS[i], KINDS[i % len(KINDS)].model_copy(update={"seed": 1000 + i}))
        for i in range(n)
    ]


def run_at(engine_dir: Path, drafters: list[Path], gamma: int, drafter: str | None, **config: int) -> Run:
    engine = load_engine(engine_dir, drafters=drafters, block_size=4, **({"num_blocks": 256} | config))
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)], drafter=drafter)
    )
    return drive(engine, requests(), per_step=3)


@pytest.fixture(scope="session")
def head_dir(spec_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained_head(spec_models["target"], tmp_path_factory.mktemp("seeded") / "fd-head", steps=60)


@pytest.fixture(scope="session")
def alone(spec_models: dict[str, Path]) -> dict[str, list[int]]:
    """The target alone (γ = 0, no drafter) on every request."""
    return run_at(spec_models["target"], [], 0, None).tokens


def test_the_target_alone_draws_each_token_keyed_on_seed_and_position(
    spec_models: dict[str, Path], alone: dict[str, list[int]]
) -> None:
    hf = hf_model(spec_models["target"])
    for req in requests():
        if req.params.processed:
            continue
        tokens = list(req.prompt_token_ids)
        for pos in range(NEW):
            with torch.inference_mode():
                row = hf(torch.tensor([tokens])).logits[0, -1:]
            tokens += keyed_draw(filtered_probs(row, [req.params]), [req.params.seed or 0], [pos])
        assert alone[req.request_id] == tokens[len(req.prompt_token_ids) :], req.request_id


@pytest.mark.parametrize("drafter", ["copy", "layer0", "rand-a", "ngram", "fd-head"])
def test_a_seeded_request_gives_the_same_text_at_any_gamma_with_any_drafter(
    spec_models: dict[str, Path], head_dir: Path, alone: dict[str, list[int]], drafter: str
) -> None:
    paths = [head_dir] if drafter == "fd-head" else [spec_models[drafter]] if drafter != "ngram" else []
    accepted = proposed = 0
    for gamma in (2, 4):
        run = run_at(spec_models["target"], paths, gamma, drafter)
        assert run.tokens == alone, f"γ = {gamma}"
        assert all(s.drafter == drafter for s in run.stats if s.gamma)
        accepted, proposed = accepted + run.total("accepted"), proposed + run.total("proposed")
    assert proposed > 0
    if drafter == "copy":  # the target's noise and distribution (the processors aside): its token
        assert accepted >= 0.8 * proposed
    elif drafter in ("layer0", "fd-head"):  # coupled enough to accept, not always
        assert 0 < accepted < proposed


def test_seeded_text_survives_random_speculation_offload_and_preemption(
    spec_models: dict[str, Path], drafter_dirs: list[Path], head_dir: Path, alone: dict[str, list[int]]
) -> None:
    """A fresh random γ and drafter every step, the draft offloaded and reloaded mid-generation,
    and a KV pool so small that sequences are preempted and recomputed."""
    engine = load_engine(
        spec_models["target"], drafters=[*drafter_dirs, head_dir], block_size=4, num_blocks=40
    )
    run = scheduled_run(engine, requests(), seed=5, offload_steps=set(range(10, 24)))
    assert run.tokens == alone
    assert run.total("preempted") + sum(e.preempted for s in run.stats for e in s.memory_events) > 0
    assert len({s.drafter for s in run.stats if s.gamma}) >= 3
    assert 0 < run.total("accepted") < run.total("proposed")


def test_a_resumed_request_continues_with_the_tokens_it_would_have_drawn(
    spec_models: dict[str, Path], alone: dict[str, list[int]]
) -> None:
    """The worker's failover path: a re-run gets prompt + the tokens sent (``JobRun``'s
    engine request), at another γ, and goes on exactly as the first attempt would have —
    penalties and min_tokens counting the sent tokens as output."""
    tok = build_tokenizer()
    engine = load_engine(
        spec_models["target"], drafters=[spec_models["layer0"]], block_size=4, num_blocks=256
    )
    apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 3)]))
    reruns = []
    for k, req in enumerate(requests(8)):
        sent = alone[req.request_id][: 1 + 4 * k % (NEW - 1)]
        job = JobRequest(job_id=f"j{k}", prompt_token_ids=req.prompt_token_ids, params=req.params)
        run = JobRun(job, b"1-0", list(req.prompt_token_ids), tok, "w", Resume(token_ids=tuple(sent)))
        reruns.append((req.request_id, len(sent), run.engine_request()))
    assert any(n > 1 and r.params.processed for _, n, r in reruns)
    done = drive(engine, [r for _, _, r in reruns])
    for rid, n, r in reruns:
        assert r.resumed == n and r.params.max_tokens == NEW - n
        assert done.tokens[r.request_id] == alone[rid][n:], rid


def test_processors_count_a_resumes_sent_tokens_as_output(spec_models: dict[str, Path]) -> None:
    """The rows a resumed sequence is verified on are its first attempt's: presence and
    frequency penalties and min_tokens see the output sent before the failover."""
    params = PROCESSED.model_copy(update={"seed": 1})
    prompt, sent = PROMPTS[2], [9, 9, 4]
    logits = torch.randn(1, 96, generator=torch.Generator().manual_seed(0))
    first = Sequence("a", list(prompt), params, token_ids=[*prompt, *sent])
    resumed = Sequence("b", [*prompt, *sent], params, resumed=len(sent))
    assert torch.equal(
        process_rows(logits, first, [], frozenset({2})), process_rows(logits, resumed, [], frozenset({2}))
    )
    assert resumed.position(len(resumed.token_ids)) == first.position(len(first.token_ids)) == len(sent)


def test_a_model_drafter_proposes_the_targets_own_draws_when_it_is_the_target(
    spec_models: dict[str, Path], alone: dict[str, list[int]]
) -> None:
    """Coupled drafting: a drafter draws at each draft's output position with the target's
    noise, so a copy of the target proposes exactly the target's continuation."""
    drafter = make_drafter(spec_models["copy"])
    reqs = [r for r in requests() if not r.params.processed][:4]
    seqs = []
    for r in reqs:
        out = alone[r.request_id]
        seqs.append(
            Sequence(
                r.request_id, list(r.prompt_token_ids), r.params, token_ids=[*r.prompt_token_ids, *out[:5]]
            )
        )
    proposal = drafter.propose(seqs, [6] * len(seqs))
    for r, tokens, q in zip(reqs, proposal.tokens, proposal.probs, strict=True):
        assert tokens == alone[r.request_id][5:11] and q is not None
