"""Logprobs (worker/engine/logprobs.py): the target's raw log-softmax at each emitted
position, the same whether a token came from plain decoding or was accepted under
speculation (random γ per step, model and n-gram drafters), equal to a plain transformers
forward of the whole sequence; prompt logprobs with prefix caching, exact repeats and
chunked prefill; raw (before temperature and penalties) for sampled, processed requests."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.control import ALL_BATCHES, Decision
from shared.schemas import Logprobs, SamplingParams
from tests.worker.engine.drive import Run, drive
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.tiny import hf_model
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.logprobs import FLOOR, score
from worker.speculation import apply_decision

NEW = 20
K = 5
TOL = 1e-4  # float32, a different kernel (transformers) against the engine's


def collect(run_outputs: list[Any]) -> dict[str, Logprobs]:
    parts: dict[str, list[Logprobs]] = {}
    for out in run_outputs:
        if out.logprobs is not None:
            parts.setdefault(out.request_id, []).append(out.logprobs)
    return {rid: Logprobs.join(p) for rid, p in parts.items()}


def recording(engine: Any) -> list[Any]:
    """Every RequestOutput the engine's steps return from now on, in order."""
    outputs: list[Any] = []
    step = engine.step

    def keep() -> Any:
        result = step()
        outputs.extend(result.outputs)
        return result

    engine.step = keep
    return outputs


def stepped(engine: Any, reqs: list[EngineRequest], gamma: int) -> tuple[Run, list[Any]]:
    """drive() at a fixed γ, keeping every RequestOutput."""
    apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)]))
    outputs = recording(engine)
    return drive(engine, reqs), outputs


def hf_logprobs(hf: Any, tokens: list[int]) -> torch.Tensor:
    """log_softmax of a plain forward over ``tokens``: row p scores token p + 1."""
    with torch.inference_mode():
        logits = hf(torch.tensor([tokens])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def assert_matches_hf(hf: Any, prompt: list[int], lp: Logprobs, k: int) -> None:
    full = hf_logprobs(hf, prompt + lp.token_ids)
    rows = full[len(prompt) - 1 : len(prompt) - 1 + len(lp)]
    got = torch.tensor(lp.logprobs)
    want = rows.gather(1, torch.tensor(lp.token_ids).unsqueeze(1)).squeeze(1)
    assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()
    if k:
        top = rows.topk(k, dim=-1)
        assert torch.allclose(torch.tensor(lp.top_logprobs), top.values, atol=TOL)
        assert lp.top_ids == top.indices.tolist()


def random_gamma_run(engine: Any, reqs: list[EngineRequest], drafter: str, seed: int) -> Run:
    """drive(), with a random γ (0..4) before every step from ``drafter``."""
    rng = random.Random(seed)
    pending, run = list(reqs), Run()
    for step in range(10_000):
        for req in pending[:3]:
            engine.add_request(req)
        del pending[:3]
        if not pending and not engine.has_unfinished():
            return run
        table = [(1, rng.randrange(5)), (ALL_BATCHES, rng.randrange(5))]
        apply_decision(engine, Decision(version=step + 1, policy="test", gamma_table=table, drafter=drafter))
        result = engine.step()
        run.stats.append(result.stats)
        for out in result.outputs:
            run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize(("drafter", "seed"), [("ngram", 0), ("layer0", 1), ("copy", 2)])
def test_greedy_logprobs_equal_under_random_speculation(
    spec_models: dict[str, Path], drafter_dirs: list[Path], drafter: str, seed: int
) -> None:
    prompts = PROMPTS[:12]
    params = SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=K)
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]
    config: dict[str, Any] = dict(block_size=4, num_blocks=96, max_num_batched_tokens=48)

    base_engine = load_engine(spec_models["target"], drafters=drafter_dirs, **config)
    base, base_outputs = stepped(base_engine, reqs, 0)
    plain = collect(base_outputs)

    engine = load_engine(spec_models["target"], drafters=drafter_dirs, **config)
    outputs = recording(engine)
    spec = random_gamma_run(
        engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)], drafter, seed
    )
    assert {s.drafter for s in spec.stats if s.gamma} == {drafter}
    assert spec.total("accepted") > 0, "nothing was accepted: the test checks nothing about speculation"
    speculated = collect(outputs)

    hf = hf_model(spec_models["target"])
    for i, p in enumerate(prompts):
        rid = str(i)
        assert spec.tokens[rid] == base.tokens[rid]
        a, b = speculated[rid], plain[rid]
        assert a.token_ids == spec.tokens[rid] == b.token_ids
        assert len(a.logprobs) == NEW
        assert a.top_ids == b.top_ids
        # The same target logits at the same positions: equal up to the forward's shape
        # (γ+1 rows or one), within float32 rounding.
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        assert torch.allclose(torch.tensor(a.top_logprobs), torch.tensor(b.top_logprobs), atol=1e-5)
        # Greedy: the chosen token is the top one.
        assert [t[0] for t in a.top_ids] == a.token_ids
        assert_matches_hf(hf, p, a, K)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prompt_logprobs_with_prefix_hits_repeats_and_chunks(llama_dir: Path, prefix_caching: bool) -> None:
    """The same prompts three times (prefix hits and exact repeats for plain requests in
    between), prefilled in chunks of at most 16 tokens: every prompt-logprob request gets
    its whole prompt scored, the first token None."""
    engine = load_engine(
        llama_dir,
        block_size=4,
        num_blocks=256,
        max_num_batched_tokens=16,
        enable_prefix_caching=prefix_caching,
    )
    prompts = [p for p in PROMPTS[:9] if len(p) > 1]
    plain = SamplingParams(max_tokens=3)
    asks = SamplingParams(max_tokens=2, prompt_logprobs=2, logprobs=0)
    reqs = [EngineRequest(f"plain{i}", p, plain) for i, p in enumerate(prompts)]
    reqs += [EngineRequest(f"lp{i}", p, asks) for i, p in enumerate(prompts)]
    reqs += [EngineRequest(f"again{i}", p, asks) for i, p in enumerate(prompts)]
    run, outputs = stepped(engine, reqs, 0)
    got: dict[str, Logprobs] = {}
    for out in outputs:
        if out.prompt_logprobs is not None:
            assert out.request_id not in got, "prompt logprobs reported twice"
            assert out.new_token_ids, "prompt logprobs come with the first token"
            got[out.request_id] = out.prompt_logprobs
        if out.request_id.startswith("plain"):
            assert out.logprobs is None and out.prompt_logprobs is None
    hf = hf_model(llama_dir)
    for i, p in enumerate(prompts):
        ref = hf_logprobs(hf, p)
        for rid in (f"lp{i}", f"again{i}"):
            lp = got[rid]
            assert lp.token_ids == p
            assert lp.logprobs[0] is None and lp.top_ids[0] == []
            want = ref[:-1].gather(1, torch.tensor(p[1:]).unsqueeze(1)).squeeze(1)
            assert torch.allclose(torch.tensor(lp.logprobs[1:]), want, atol=TOL)
            assert lp.top_ids[1:] == ref[:-1].topk(2, dim=-1).indices.tolist()
            assert len(run.tokens[rid]) == 2
    if prefix_caching:
        assert run.total("prefix_hits") > 0


def test_sampled_processed_logprobs_are_raw(llama_dir: Path) -> None:
    """Temperature, top-k and a repetition penalty change what is drawn, not the logprobs
    reported: those are the target's own log-softmax at each position."""
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    params = SamplingParams(
        max_tokens=12, temperature=0.8, top_k=20, repetition_penalty=1.3, seed=5, ignore_eos=True, logprobs=3
    )
    prompts = PROMPTS[:4]
    _, outputs = stepped(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)], 0)
    got = collect(outputs)
    hf = hf_model(llama_dir)
    for i, p in enumerate(prompts):
        assert len(got[str(i)]) == 12
        assert_matches_hf(hf, p, got[str(i)], 3)


def test_scores_are_finite_numbers() -> None:
    """-inf (a masked logit) and NaN are reported as FLOOR: JSON carries neither."""
    rows = torch.tensor([[0.0, float("-inf"), 1.0], [float("nan"), 0.0, 0.0]])
    got = score(rows, [1, 0], 3)
    assert got[0][1] == FLOOR and got[1][1] == FLOOR
    assert all(math.isfinite(v) for g in got for v in g[3])
    assert got[0][2] == [2, 0, 1]


def test_one_batch_of_different_ks(llama_dir: Path) -> None:
    """Sequences asking for different k (and none) share a step's one scoring pass: each
    gets its own top k, the values of a plain forward."""
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    ks = [None, 0, 2, 5]
    reqs = [
        EngineRequest(str(i), PROMPTS[i], SamplingParams(max_tokens=6, ignore_eos=True, logprobs=k))
        for i, k in enumerate(ks)
    ]
    _, outputs = stepped(engine, reqs, 0)
    got = collect(outputs)
    assert "0" not in got
    hf = hf_model(llama_dir)
    for i, k in enumerate([0, 2, 5], start=1):
        lp = got[str(i)]
        assert len(lp) == 6 and all(len(t) == k for t in lp.top_ids)
        assert_matches_hf(hf, PROMPTS[i], lp, k)


def test_only_asking_sequences_get_extra_rows(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefill of a request without prompt logprobs (none at all, or the output's) asks
    the forward for its last row only; a prompt-logprobs request's for every row."""
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    seen: dict[int, list[int]] = {}  # prompt length -> rows asked per forward item
    run = engine.runner.run

    def counted(items: Any) -> Any:
        for item in items:
            if item.start == 0:
                seen.setdefault(len(item.token_ids), []).append(item.num_logits)
        return run(items)

    monkeypatch.setattr(engine.runner, "run", counted)
    plain, output, asks = PROMPTS[3][:7], PROMPTS[1][:9], PROMPTS[2][:13]
    drive(
        engine,
        [
            EngineRequest("plain", plain, SamplingParams(max_tokens=2)),
            EngineRequest("output", output, SamplingParams(max_tokens=2, logprobs=3)),
            EngineRequest("asks", asks, SamplingParams(max_tokens=2, prompt_logprobs=0)),
        ],
    )
    assert seen == {len(plain): [1], len(output): [1], len(asks): [len(asks)]}
