"""LLMEngine greedy output equals transformers' generate, token for token, under staggered
arrivals, chunked prefill, preemption, prefix hits, exact repeats and cache resizing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.prompts import NEW, PROMPTS
from tests.worker.engine.tiny import ARCHS, hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine


@pytest.fixture(scope="session")
def references(llama_dir: Path) -> list[list[int]]:
    hf = hf_model(llama_dir)
    return [hf_greedy(hf, p, NEW, stop_at_eos=False) for p in PROMPTS]


def requests(params: SamplingParams | None = None) -> list[EngineRequest]:
    params = params or SamplingParams(max_tokens=NEW, ignore_eos=True)
    return [EngineRequest(str(i), p, params) for i, p in enumerate(PROMPTS)]


def check_exact(run_tokens: dict[str, list[int]], references: list[list[int]]) -> None:
    wrong = [i for i, ref in enumerate(references) if run_tokens[str(i)] != ref]
    assert not wrong, f"requests {wrong} differ from transformers' generate"


@pytest.mark.parametrize(
    ("config", "per_step"),
    [
        (dict(max_num_batched_tokens=24, max_num_seqs=8), 2),  # chunked prefill, staggered
        (dict(max_num_batched_tokens=512, max_num_seqs=64), 0),  # everything at once
        (dict(max_num_batched_tokens=24, enable_prefix_caching=False), 3),
    ],
)
def test_greedy_matches_transformers(
    llama_dir: Path, references: list[list[int]], config: dict[str, Any], per_step: int
) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=512, **config)
    run = drive(engine, requests(), per_step)
    check_exact(run.tokens, references)
    assert all(out.finish_reason == "length" for out in run.finals.values())
    if config.get("enable_prefix_caching", True):
        assert run.total("prefix_hits") > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_preemption_under_a_tiny_kv_budget_stays_exact(llama_dir: Path, references: list[list[int]]) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=24, max_num_batched_tokens=32)
    run = drive(engine, requests(), per_step=4)
    assert run.total("preempted") > 0
    check_exact(run.tokens, references)


@pytest.mark.parametrize("partial_tail", [True, False])
def test_exact_repeat_skips_prefill_and_reuses_logits(
    llama_dir: Path, references: list[list[int]], partial_tail: bool
) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    i = next(i for i, p in enumerate(PROMPTS) if bool(len(p) % 4) == partial_tail)
    prompt = PROMPTS[i]
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    drive(engine, [EngineRequest("first", prompt, params)])
    engine.add_request(EngineRequest("again", prompt, params))
    step = engine.step()
    assert step.stats.prefill_tokens == 0 and step.stats.prefix_hits == len(prompt)
    (out,) = step.outputs
    assert out.cached_prompt_tokens == len(prompt) and len(out.new_token_ids) == 1
    rest = drive(engine, [])
    assert out.new_token_ids + rest.tokens["again"] == references[i]


@pytest.mark.parametrize("partial_tail", [True, False])
def test_exact_repeat_without_stored_logits_computes_one_token(
    llama_dir: Path, references: list[list[int]], partial_tail: bool
) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=128, logits_cache_size=0)
    i = next(i for i, p in enumerate(PROMPTS) if bool(len(p) % 4) == partial_tail)
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    drive(engine, [EngineRequest("first", PROMPTS[i], params)])
    engine.add_request(EngineRequest("again", PROMPTS[i], params))
    step = engine.step()
    assert step.stats.prefill_tokens == 1 and step.stats.prefix_hits == len(PROMPTS[i])
    (out,) = step.outputs
    assert out.new_token_ids + drive(engine, []).tokens["again"] == references[i]


def test_shared_prefix_is_served_from_cache(llama_dir: Path) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    drive(engine, [EngineRequest("a", PROMPTS[0], params)])
    run = drive(engine, [EngineRequest("b", PROMPTS[3], params)])
    # 21 shared tokens: 5 full blocks of 4 are reused.
    assert run.finals["b"].cached_prompt_tokens == 20


def test_eos_stops_like_transformers(llama_dir: Path) -> None:
    hf = hf_model(llama_dir)
    engine = load_engine(llama_dir, block_size=4, num_blocks=256)
    prompts = PROMPTS[:16]
    run = drive(
        engine, [EngineRequest(str(i), p, SamplingParams(max_tokens=40)) for i, p in enumerate(prompts)]
    )
    stopped = 0
    for i, p in enumerate(prompts):
        assert run.tokens[str(i)] == hf_greedy(hf, p, 40, stop_at_eos=True)
        stopped += run.finals[str(i)].finish_reason == "stop"
    assert stopped > 0, "no prompt hit EOS: the test checks nothing about stopping"


def test_resizing_the_cache_mid_run_keeps_outputs_exact(llama_dir: Path, references: list[list[int]]) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=200, max_num_batched_tokens=64)
    reqs = requests()
    for r in reqs:
        engine.add_request(r)
    tokens: dict[str, list[int]] = {}
    events = []
    for i in range(10_000):
        if i == 3:
            engine.set_num_blocks(40)  # shrink below what is live: moves and preemptions
        if i == 8:
            engine.set_num_blocks(300)
        if not engine.has_unfinished():
            break
        result = engine.step()
        events += result.stats.memory_events
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert [e.to_blocks for e in events] == [40, 300]
    assert events[0].moved_blocks > 0
    assert engine.runner.cache.num_blocks == 300
    check_exact(tokens, references)


def test_abort_frees_blocks_and_reports_cancelled(llama_dir: Path, references: list[list[int]]) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=128)
    for r in requests()[:3]:
        engine.add_request(r)
    engine.step()
    engine.abort_request("1")
    engine.abort_request("no-such-request")
    run = drive(engine, [])
    assert run.finals["1"].finish_reason == "cancelled"
    assert run.finals["0"].finish_reason == "length" and "no-such-request" not in run.finals
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert engine.step().outputs == []


def test_requests_that_can_never_fit_finish_with_an_error(llama_dir: Path) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=5)  # 16 tokens at most
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    run = drive(
        engine,
        [
            EngineRequest("long", list(range(3, 30)), params),
            EngineRequest("short", [5, 6, 7], params),
            EngineRequest("empty", [], params),
        ],
    )
    assert run.finals["long"].finish_reason == "error" and "16 tokens" in str(run.finals["long"].error)
    assert run.finals["empty"].finish_reason == "error"
    assert run.finals["short"].finish_reason == "length"
    assert len(run.tokens["short"]) == 16 - 3  # stopped at the largest context the cache holds


def test_a_duplicate_request_id_is_refused_without_harming_the_first(llama_dir: Path) -> None:
    engine = load_engine(llama_dir, block_size=4, num_blocks=64)
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    engine.add_request(EngineRequest("r", [5, 6, 7], params))
    engine.step()
    engine.add_request(EngineRequest("r", [8, 9], params))
    (dup, first) = engine.step().outputs
    assert dup.finish_reason == "error" and dup.error == "duplicate request id"
    assert not first.finished
    run = drive(engine, [])
    assert run.finals["r"].num_output_tokens == 5


def test_seeded_sampling_is_reproducible_in_any_batch(llama_dir: Path) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.9, top_k=20, top_p=0.9, seed=1234, ignore_eos=True)
    alone = drive(load_engine(llama_dir, num_blocks=128), [EngineRequest("x", PROMPTS[2], params)])
    crowd = [
        EngineRequest(str(i), p, SamplingParams(max_tokens=12, temperature=1.0, seed=i))
        for i, p in enumerate(PROMPTS[:8])
    ]
    busy = drive(
        load_engine(llama_dir, num_blocks=128), [*crowd, EngineRequest("x", PROMPTS[2], params)], per_step=3
    )
    assert alone.tokens["x"] == busy.tokens["x"]
    other = drive(
        load_engine(llama_dir, num_blocks=128),
        [EngineRequest("x", PROMPTS[2], params.model_copy(update={"seed": 99}))],
    )
    assert other.tokens["x"] != alone.tokens["x"]


def test_load_engine_reports_eos_and_options(llama_dir: Path) -> None:
    engine = load_engine(llama_dir, num_blocks=7, block_size=8)
    assert isinstance(engine, LLMEngine)
    assert engine.eos_token_ids == frozenset({2})
    assert engine.runner.cache.num_blocks == 7
    with pytest.raises(TypeError, match="unknown engine options"):
        load_engine(llama_dir, num_blockz=3)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_generates_exactly(arch: str, tiny_models: dict[str, Path]) -> None:
    hf = hf_model(tiny_models[arch])
    prompts = PROMPTS[:10]
    refs = [hf_greedy(hf, p, 12, stop_at_eos=False) for p in prompts]
    engine = load_engine(tiny_models[arch], block_size=4, num_blocks=40, max_num_batched_tokens=20)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    run = drive(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)], per_step=2)
    check_exact(run.tokens, refs)
