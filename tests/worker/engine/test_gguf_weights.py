"""GGUF checkpoints served from their blocks (worker/engine/gguf_file.py, gguf_weights.py), on
tiny Llamas written in every type the kernel reads: the lean header reader agrees with the
gguf package and transformers; the weights are the file's, dequantised bit for bit like
transformers' GGUF loader does; logits agree with that dequantised fp32 model; a position's
logits do not depend on the rows computed with it; greedy speculation is exact against the
same GGUF weights; and which weights a directory serves (``weights_for``, ``--dtype``)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from nj_kernels import quant_linear
from nj_kernels.quant_linear import QuantWeight, StackedWeight
from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.gguf_file import QUANTISABLE, write_gguf
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.references import scheduled_run
from tests.worker.engine.tiny import COMMON, VOCAB, hf_model
from worker.engine.api import EngineRequest
from worker.engine.gguf_file import GGUFFile
from worker.engine.gguf_weights import load_gguf_native
from worker.engine.loader import load_engine
from worker.engine.model_config import ModelConfig
from worker.engine.model_runner import ForwardItem, ModelRunner
from worker.engine.weights import load_checkpoint, weights_for

pytestmark = pytest.mark.skipif(not quant_linear.available(), reason="needs the block kernel (x86-64, cc)")

IDS = torch.randint(3, VOCAB, (23,), generator=torch.Generator().manual_seed(3)).tolist()
# A Llama whose widths are whole K-quant super-blocks (256 weights).
KQUANT = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def gguf_dir(model: torch.nn.Module, root: Path, qtype: Q, **kw: object) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    write_gguf(model, root / f"tiny.{qtype.name}.gguf", qtype, **kw)  # type: ignore[arg-type]
    return root


def logits(config: ModelConfig, state: dict, ids: list[int] = IDS) -> torch.Tensor:  # type: ignore[type-arg]
    runner = ModelRunner(config, state, 8, torch.device("cpu"), torch.float32, num_blocks=8)
    out, _ = runner.run([ForwardItem(ids, 0, [0, 1, 2], len(ids))])
    return out


def test_the_header_reader_agrees_with_gguf_and_transformers(llama_dir: Path, tmp_path: Path) -> None:
    path = gguf_dir(hf_model(llama_dir), tmp_path, Q.Q4_1) / "tiny.Q4_1.gguf"
    ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
    assert sorted(ours.tensors) == sorted(t.name for t in theirs.tensors)
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.type == int(t.tensor_type)
        assert mine.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert np.array_equal(ours.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))
    ref = AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name).to_dict()
    assert ModelConfig.from_dict(ours.hf_config()) == ModelConfig.from_dict(ref)
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF"):
        GGUFFile(tmp_path / "bad.gguf")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        GGUFFile(tmp_path / "cut.gguf")


@pytest.mark.parametrize("qtype", [*QUANTISABLE, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_weights_stay_blocks_and_compute_like_the_dequantised_model(
    llama_dir: Path, tmp_path: Path, qtype: Q
) -> None:
    """Every matrix is a QuantWeight of the file's type whose dequantisation equals
    transformers' GGUF loader's fp32 tensor bit for bit (q/k rows put back in its order; an
    all-F32 file's matrices are those tensors themselves); the logits equal that fp32 model's
    within 1e-5 of their largest magnitude."""
    kquant = qtype in (Q.Q4_K, Q.Q6_K)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**KQUANT)).eval() if kquant else hf_model(llama_dir)
    path = gguf_dir(model, tmp_path, qtype)
    config, state = load_gguf_native(path / f"tiny.{qtype.name}.gguf")
    ref_config, ref_state = load_checkpoint(path, f"tiny.{qtype.name}.gguf")  # transformers dequantises
    assert replace(config, torch_dtype="float32") == ref_config  # the loader's dtype, not the file's
    matrices = {k: v for k, v in state.items() if k.endswith("weight") and "norm" not in k}
    assert len(matrices) == 1 + 7 * config.num_layers + (not config.tie_word_embeddings)
    for name, w in matrices.items():
        ref = ref_state[name]
        assert isinstance(ref, torch.Tensor)
        if qtype == Q.F32:  # nothing to dequantise: plain fp32 tensors (the fused decode path)
            assert isinstance(w, torch.Tensor), name
            assert torch.equal(w.view(torch.int32), ref.view(torch.int32)), name
            continue
        assert isinstance(w, QuantWeight) and w.type_name == qtype.name, name
        assert torch.equal(w.dequantize().view(torch.int32), ref.view(torch.int32)), name
    ours, ref = logits(config, state), logits(ref_config, dict(ref_state))
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-5


def test_mixed_types_in_one_fused_matrix(llama_dir: Path, tmp_path: Path) -> None:
    """llama.cpp's mixed quantisations give v (and down) another type than q/k: the fused
    q/k/v is stacked from its parts, each multiplied from its own blocks."""
    types = {"blk.0.attn_v.weight": Q.Q8_0, "blk.1.attn_v.weight": Q.F16, "blk.0.ffn_down.weight": Q.Q8_0}
    path = gguf_dir(hf_model(llama_dir), tmp_path, Q.Q4_0, types=types)
    engine = load_engine(path, num_blocks=8, block_size=8)
    assert isinstance(engine.runner.model.layers[0].qkv, StackedWeight)
    assert engine.weights.startswith("Q4_0+")
    ref = load_engine(path, num_blocks=8, block_size=8, dtype="float32")
    a, _ = engine.runner.run([ForwardItem(IDS, 0, [0, 1, 2], len(IDS))])
    b, _ = ref.runner.run([ForwardItem(IDS, 0, [0, 1, 2], len(IDS))])
    assert float((a - b).abs().max() / b.abs().max()) <= 1e-5


def test_a_positions_logits_do_not_depend_on_the_rows_around_it(llama_dir: Path, tmp_path: Path) -> None:
    """A verification of γ+1 rows, next to other sequences' rows, gives each position the
    bits a one-row decode step gives it: the whole forward on GGUF blocks is row-invariant."""
    engine = load_engine(gguf_dir(hf_model(llama_dir), tmp_path, Q.Q4_1), num_blocks=200, block_size=8)
    runner, rng = engine.runner, random.Random(0)
    seqs = []
    for b in range(12):
        n = rng.randint(8, 60)
        ids, table = [rng.randrange(3, VOCAB) for _ in range(n)], list(range(b * 10, b * 10 + 10))
        runner.run([ForwardItem(ids[:-5], 0, table, 1)])
        seqs.append((ids, table))
    verify, first = runner.run([ForwardItem(ids[-5:], len(ids) - 5, table, 5) for ids, table in seqs])
    for s, (ids, table) in enumerate(seqs):
        for j in range(5):
            pos = len(ids) - 5 + j
            alone, _ = runner.run([ForwardItem([ids[pos]], pos, table, 1)])
            assert torch.equal(verify[first[s] + j], alone[0]), f"sequence {s}, row {j}"


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_speculation_is_exact_against_the_same_gguf_weights(
    spec_models: dict[str, Path], drafter_dirs: list[Path], tmp_path: Path, seed: int
) -> None:
    """Random γ per step and batch bucket, every drafter (fp32 models and n-gram), drafter
    switches, offload and reload, prefix hits, chunked prefill: the same tokens as the Q4_1
    target alone at γ = 0."""
    path = gguf_dir(hf_model(spec_models["target"]), tmp_path / "target", Q.Q4_1)
    cfg = dict(block_size=4, num_blocks=48, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(PROMPTS)]
    alone = drive(load_engine(path, ngram=False, **cfg), reqs)  # type: ignore[arg-type]
    engine = load_engine(path, drafters=drafter_dirs, **cfg)  # type: ignore[arg-type]
    assert engine.weights == "Q4_1"
    reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(PROMPTS)]
    run = scheduled_run(engine, reqs, seed, offload_steps=set(range(6, 12)))
    assert run.tokens == alone.tokens
    assert run.total("accepted") > 0 and sum(s.prefix_hits for s in run.stats) > 0
    assert [e.kind for s in run.stats for e in s.memory_events][:2] == ["offload", "reload"]


def test_which_weights_a_directory_serves(
    llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF beside a safetensors export: its blocks by default on CPU; ``dtype`` (the CLI's
    --dtype fp32) the safetensors as before; a GGUF alone with a dtype, or where the kernel
    cannot be built: dequantised."""
    both = tmp_path / "both"
    hf_model(llama_dir).save_pretrained(both)
    write_gguf(hf_model(llama_dir), both / "m.gguf", Q.Q8_0)
    assert weights_for(both).native and weights_for(both).gguf_file == "m.gguf"
    assert weights_for(both, dtype="float32").gguf_file is None
    assert not weights_for(both, device="cuda").native
    alone = gguf_dir(hf_model(llama_dir), tmp_path / "alone", Q.Q4_0)
    assert weights_for(alone, dtype="float32").gguf_file == "tiny.Q4_0.gguf"
    assert not weights_for(alone, dtype="float32").native
    assert load_engine(both, num_blocks=8).weights == "Q8_0"
    assert load_engine(both, num_blocks=8, dtype="float32").weights == "float32"
    served = load_engine(alone / "tiny.Q4_0.gguf", num_blocks=8)  # a .gguf file as the model
    assert served.weights == "Q4_0"
    assert served.runner.weight_bytes < load_engine(both, num_blocks=8).runner.weight_bytes
    monkeypatch.setattr(quant_linear, "available", lambda: False)  # no compiler, not x86-64
    assert weights_for(both) == weights_for(both, dtype="float32")
    assert not weights_for(alone).native and weights_for(alone).gguf_file == "tiny.Q4_0.gguf"


def test_an_all_f32_file_takes_the_fused_fp32_path(llama_dir: Path, tmp_path: Path) -> None:
    """Nothing to dequantise in an F32 file: its matrices are plain fp32 tensors, the fused C
    decode path runs them, and it serves what the same weights as safetensors serve."""
    from nj_kernels import cpu_decode

    path = gguf_dir(hf_model(llama_dir), tmp_path, Q.F32)
    engine = load_engine(path, num_blocks=8, block_size=8)
    assert engine.weights == "float32" and not engine.runner.row_invariant
    assert (engine.runner.model.fused_layers() is not None) == cpu_decode.available()
    ref = load_engine(llama_dir, num_blocks=8, block_size=8)
    a, _ = engine.runner.run([ForwardItem(IDS, 0, [0, 1, 2], len(IDS))])
    b, _ = ref.runner.run([ForwardItem(IDS, 0, [0, 1, 2], len(IDS))])
    assert torch.equal(a, b)  # the same bytes, the same path
