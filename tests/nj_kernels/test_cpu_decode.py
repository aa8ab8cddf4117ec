"""The fused C decode path (nj_kernels/cpu_decode.py): the op-by-op torch path's results to
rounding on every architecture variant it takes (GQA and MHA, biases, per-head q/k norms, head
widths that leave vector tails, pages crossed), a row's result independent of its batch bit
for bit (a verification row equals the decode row at its position), inputs out of range
refused before anything is written, and the dispatch (few fp32 CPU rows only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nj_kernels import cpu_decode, cpu_linear
from tests.nj_kernels.random_models import BS, VARIANTS, VOCAB, make_runner, state_of
from worker.engine.model_runner import ForwardItem, ModelRunner

pytestmark = pytest.mark.skipif(not cpu_decode.available(), reason="needs cc with AVX2/FMA (x86-64)")


@pytest.fixture
def fused_off() -> Iterator[None]:
    cpu_decode.set_enabled(False)
    yield
    cpu_decode.set_enabled(True)


def prefilled(runner: ModelRunner) -> tuple[list[int], list[int], list[int], list[int]]:
    """Two sequences' prompts (13 and 7 tokens) cached op by op; their tokens and tables."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, VOCAB, (16,), generator=g).tolist()
    b = torch.randint(0, VOCAB, (8,), generator=g).tolist()
    ta, tb = [9, 2, 30, 17, 5], [40, 11]  # scattered pages: a kernel reading them in order fails
    cpu_decode.set_enabled(False)
    try:
        runner.run([ForwardItem(a[:13], 0, ta, 1), ForwardItem(b[:7], 0, tb, 1)])
    finally:
        cpu_decode.set_enabled(True)
    return a, b, ta, tb


def step_items(a: list[int], b: list[int], ta: list[int], tb: list[int]) -> list[ForwardItem]:
    """A verification of 3 rows for a, a decode row for b: two attention groups."""
    return [ForwardItem(a[13:16], 13, ta, 3), ForwardItem(b[7:8], 7, tb, 1)]


def fused_and_reference(
    runner: ModelRunner,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step from the same prefilled cache, fused and then op by op: the fused
    logits, the fused cache, the op-by-op logits and the cache before the step (the runner's
    cache is left as op by op wrote it)."""
    a, b, ta, tb = prefilled(runner)
    snapshot = runner.cache.kv.clone()
    fused, _ = runner.run(step_items(a, b, ta, tb))
    fused_kv = runner.cache.kv.clone()
    runner.cache.kv.copy_(snapshot)
    cpu_decode.set_enabled(False)
    try:
        ref, _ = runner.run(step_items(a, b, ta, tb))
    finally:
        cpu_decode.set_enabled(True)
    return fused, fused_kv, ref, snapshot


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_layers_match_the_op_by_op_path(variant: str) -> None:
    runner = make_runner(**VARIANTS[variant])
    assert runner.model.fused_layers() is not None
    fused, fused_kv, ref, snapshot = fused_and_reference(runner)
    assert fused.shape == ref.shape == (4, VOCAB)
    assert float((fused - ref).abs().max() / ref.abs().max()) <= 2e-5
    assert torch.equal(fused.argmax(-1), ref.argmax(-1))
    torch.testing.assert_close(
        fused_kv, runner.cache.kv, rtol=1e-5, atol=2e-5
    )  # the same keys and values written
    assert not torch.equal(fused_kv, snapshot)


@pytest.mark.parametrize("variant", ["llama_gqa", "odd_widths", "qwen3_qk_norm", "gqa5_64"])
def test_a_rows_result_does_not_depend_on_its_batch(variant: str) -> None:
    """A verification of 3 rows beside another sequence's decode row, and the same rows run one
    at a time as decode steps: the same hidden states and logits, bit for bit."""
    runner = make_runner(**VARIANTS[variant])
    a, b, ta, tb = prefilled(runner)
    snapshot = runner.cache.kv.clone()
    together, first = runner.run(step_items(a, b, ta, tb))
    runner.cache.kv.copy_(snapshot)
    alone = [runner.run([ForwardItem([a[p]], p, ta, 1)])[0][0] for p in (13, 14, 15)]
    alone.append(runner.run([ForwardItem([b[7]], 7, tb, 1)])[0][0])
    assert torch.equal(together[first[0] : first[0] + 3], torch.stack(alone[:3]))
    assert torch.equal(together[first[1]], alone[3])


def test_inputs_out_of_range_are_refused_before_anything_is_written() -> None:
    runner = make_runner(**VARIANTS["llama_gqa"])
    model, kv = runner.model, runner.cache.kv
    fused = model.fused_layers()
    assert fused is not None
    cos, sin = model.rotary.table(64)
    table = torch.tensor([[3, 4]], dtype=torch.int32)

    class Rows:
        row_start, num_seqs, num_queries, block_tables = 0, 1, 1, table

    hidden = torch.randn(1, 64)
    kv.fill_(0.5)
    bad = [
        (torch.tensor([5]), torch.tensor([kv.shape[2] * BS])),  # slot past the cache
        (torch.tensor([8]), torch.tensor([12])),  # position past its block table
        (torch.tensor([70]), torch.tensor([12])),  # position past the rotary table
        (torch.tensor([-1]), torch.tensor([12])),
    ]
    for positions, slots in bad:
        with pytest.raises(ValueError):
            fused.run(hidden, positions, slots, kv, [Rows()], cos, sin)
    Rows.block_tables = torch.tensor([[3, 999]], dtype=torch.int32)  # a block id past the cache
    with pytest.raises(ValueError):
        fused.run(hidden, torch.tensor([5]), torch.tensor([12]), kv, [Rows()], cos, sin)
    Rows.block_tables, Rows.num_seqs = table, 2  # claims a row the batch does not have
    with pytest.raises(ValueError):
        fused.run(hidden, torch.tensor([5]), torch.tensor([12]), kv, [Rows()], cos, sin)
    assert bool((kv == 0.5).all())
    Rows.num_seqs = 1
    out = fused.run(hidden, torch.tensor([5]), torch.tensor([13]), kv, [Rows()], cos, sin)
    assert out.shape == (1, 64) and bool(out.isfinite().all()) and not bool((kv == 0.5).all())


def test_dispatch_few_fp32_cpu_rows_take_the_fused_path(fused_off: None) -> None:
    assert cpu_decode.max_rows() == 0
    cpu_decode.set_enabled(True)
    assert cpu_decode.max_rows() >= cpu_linear.max_rows() > 0
    cpu_linear.set_enabled(False)  # NIGHTJAR_SKINNY=off turns both off
    assert cpu_decode.max_rows() == 0
    cpu_linear.set_enabled(True)
    runner = make_runner(**VARIANTS["llama_gqa"])
    model = runner.model
    calls: list[int] = []
    fused = model.fused_layers()
    assert fused is not None
    real = fused.run

    def counting(hidden: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return real(hidden, *args)

    fused.run = counting  # type: ignore[method-assign]
    rows = cpu_decode.max_rows()
    tokens = [t % VOCAB for t in range(rows + 1)]
    runner.run([ForwardItem(tokens[:rows], 0, list(range(rows // BS + 1)), 1)])
    runner.run([ForwardItem(tokens, 0, list(range(rows // BS + 1)), 1)])
    assert calls == [rows]  # more rows than the kernel takes: op by op
    model.weights_changed()  # elastic memory swapped the tensors: bound again
    assert model.fused_layers() is not fused
    double = ModelRunner(runner.config, {k: v.double() for k, v in state_of(runner).items()}, BS,
                         torch.device("cpu"), torch.float64, num_blocks=8)  # fmt: skip
    assert double.model.fused_layers() is None


GGUF_VARIANTS = ["llama_gqa", "qwen2_biases", "qwen3_qk_norm", "gqa5_64"]  # widths whole blocks of 32
Q4_1, Q8_0 = 3, 8  # GGML type ids


@pytest.mark.parametrize("qtype", [Q4_1, Q8_0], ids=["Q4_1", "Q8_0"])
@pytest.mark.parametrize("variant", GGUF_VARIANTS)
def test_gguf_layers_match_the_op_by_op_path(variant: str, qtype: int) -> None:
    """Matrices as GGUF blocks: the fused path multiplies them with the block kernel's own
    function, so only the norms, rotary, attention and SiLU round differently from torch's."""
    runner = make_runner(**VARIANTS[variant], qtype=qtype)
    fused_layers = runner.model.fused_layers()
    assert fused_layers is not None and fused_layers.any_rows
    fused, fused_kv, ref, _ = fused_and_reference(runner)
    assert float((fused - ref).abs().max() / ref.abs().max()) <= 2e-5
    assert torch.equal(fused.argmax(-1), ref.argmax(-1))
    torch.testing.assert_close(fused_kv, runner.cache.kv, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("qtype", [Q4_1, Q8_0], ids=["Q4_1", "Q8_0"])
def test_gguf_models_take_the_fused_path_for_any_rows_with_the_same_bits(qtype: int) -> None:
    """A 70-row prompt chunk (more than max_rows) runs fused too, and gives each position the
    logits and cache entries its one-row decode step gives, bit for bit; with the fused path
    off every forward runs op by op."""
    runner = make_runner(**VARIANTS["llama_gqa"], qtype=qtype)
    fused = runner.model.fused_layers()
    assert fused is not None and fused.any_rows
    calls: list[int] = []
    real = fused.run

    def counting(hidden: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return real(hidden, *args)

    fused.run = counting  # type: ignore[method-assign]
    n = 70
    assert n > cpu_decode.max_rows()
    tokens = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(5)).tolist()
    table = list(range(n // BS + 1))
    chunk, _ = runner.run([ForwardItem(tokens, 0, table, n)])
    chunk_kv = runner.cache.kv.clone()
    runner.cache.kv.zero_()
    alone = torch.stack([runner.run([ForwardItem([tokens[p]], p, table, 1)])[0][0] for p in range(n)])
    assert calls == [n] + [1] * n
    assert torch.equal(chunk, alone) and torch.equal(chunk_kv, runner.cache.kv)
    cpu_decode.set_enabled(False)
    try:
        ref, _ = runner.run([ForwardItem(tokens, 0, table, n)])
    finally:
        cpu_decode.set_enabled(True)
    assert len(calls) == n + 1  # op by op
    assert float((chunk - ref).abs().max() / ref.abs().max()) <= 2e-5


def test_a_matrix_of_another_shape_or_type_is_refused() -> None:
    """The C code reads a matrix as the dimensions say: a block matrix of another shape, or a
    weight it cannot read, is refused when the layers are bound."""
    model = make_runner(**VARIANTS["llama_gqa"], qtype=Q4_1).model
    fused = model.fused_layers()
    assert fused is not None
    layers = [dict(vars(layer)) for layer in model.layers]
    layers[1]["o"] = model.layers[1].down  # [64, 96] where o is [64, 64]
    with pytest.raises(ValueError, match="not"):
        cpu_decode.DecodeLayers(fused.dims, layers)
    layers[1]["o"] = torch.zeros(64, 64, dtype=torch.float64)
    with pytest.raises(ValueError, match="GGUF blocks"):
        cpu_decode.DecodeLayers(fused.dims, layers)
