"""Structured output keeps speculation exact: greedy output with a JSON-schema grammar under
random per-step γ schedules and drafter switches (model drafters and n-gram) equals γ = 0
with the same grammar, both equal an independent reference (transformers' forward + an
llguidance matcher stepped by hand), and the output parses and validates; sampled output
keeps the masked target distribution (chi-square)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoTokenizer

from shared.control import ALL_BATCHES, Decision
from shared.grammar import grammar_text
from shared.schemas import SamplingParams
from shared.structured import StructuredOutput
from tests.tiny_models import TEXT, build_llama
from tests.worker.engine.drafters import first_layers
from tests.worker.engine.drive import drive
from tests.worker.engine.spec.references import scheduled_run
from tests.worker.engine.tiny import hf_model
from worker.engine import sampler, sequence
from worker.engine.api import EngineRequest
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

jsonschema_rs = pytest.importorskip("jsonschema_rs")

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 2},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
SPEC = StructuredOutput(json=SCHEMA)
NEW = 80


@pytest.fixture(scope="session")
def bpe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama with a real BPE tokenizer (grammars need one) and two model drafters."""
    root = tmp_path_factory.mktemp("structured")
    target = build_llama(root / "target")
    return {
        "target": target,
        "copy": Path(shutil.copytree(target, root / "copy")),
        "layer0": first_layers(target, root / "layer0", 1),
    }


def prompts(tok: Any) -> list[list[int]]:
    return [tok(t[: 8 + 5 * i])["input_ids"] for i, t in enumerate(TEXT * 2)]


def reference(model: Any, lt: llguidance.LLTokenizer, prompt: list[int], eos: set[int]) -> list[int]:
    """Greedy decoding under the grammar, one full forward and one matcher step per token."""
    m = llguidance.LLMatcher(lt, grammar_text(SPEC))
    gen: list[int] = []
    with torch.inference_mode():
        for _ in range(NEW):
            row = model(torch.tensor([prompt + gen])).logits[0, -1].float()
            bias = np.frombuffer(m.compute_logit_bias(), dtype=np.uint8)[: row.shape[0]]
            row = row.masked_fill(torch.from_numpy(bias == 0), float("-inf"))
            tok = int(row.argmax())
            gen.append(tok)
            assert m.consume_token(tok)
            if m.is_stopped() or tok in eos:
                break
    return gen


def test_greedy_json_schema_is_exact_under_random_speculation(bpe_models: dict[str, Path]) -> None:
    tok = AutoTokenizer.from_pretrained(bpe_models["target"])
    params = SamplingParams(max_tokens=NEW, structured=SPEC)
    runs = []
    for seed in (None, 0, 1, 2):
        engine = load_engine(
            bpe_models["target"],
            drafters=[bpe_models["copy"], bpe_models["layer0"]],
            block_size=4,
            num_blocks=512,
            max_num_batched_tokens=64,
        )
        reqs = [EngineRequest(str(i), p, params) for i, p in enumerate(prompts(tok))]
        if seed is None:  # the target alone
            apply_decision(engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 0)]))
            runs.append(drive(engine, reqs))
        else:
            runs.append(scheduled_run(engine, reqs, seed, offload_steps=set()))
        eos = set(engine.eos_token_ids)
    plain, *spec = runs
    assert all(r.total("accepted") > 0 for r in spec), "no draft was accepted: nothing was verified"
    # Drafts the grammar forbids are cut before verification; some that fit are still wrong.
    assert any(r.total("proposed") > r.total("accepted") for r in spec), "no draft was rejected"
    assert all({s.drafter for s in r.stats if s.gamma} >= {"copy", "layer0", "ngram"} for r in spec)
    hf, lt = hf_model(bpe_models["target"]), llguidance.hf.from_tokenizer(tok, len(tok), sorted(eos))  # type: ignore[arg-type]
    validator = jsonschema_rs.validator_for(SCHEMA)
    for i, p in enumerate(prompts(tok)):
        out = plain.tokens[str(i)]
        assert out == reference(hf, lt, p, eos), f"prompt {i}: the engine alone differs from the reference"
        for run in spec:
            assert run.tokens[str(i)] == out, f"prompt {i}: speculation changed the constrained output"
        assert plain.finals[str(i)].finish_reason == "stop"
        assert validator.is_valid(json.loads(str(tok.decode(out, skip_special_tokens=True))))


TRIALS = 1500


@pytest.mark.parametrize(
    ("drafter", "scheme"), [("copy", "keyed"), ("ngram", "keyed"), ("copy", "rejection")]
)
def test_sampling_keeps_the_masked_target_distribution(
    bpe_models: dict[str, Path], drafter: str, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A regex of three digits 0-4 (single tokens in this tokenizer): the joint frequencies of
    digits 2 and 3, drawn in a speculative step (γ = 3), against the exact masked target.
    Seeded requests draw keyed (a copy of the target then proposes, after the grammar's cut,
    the masked race's own winner); "rejection" runs them through rejection sampling as
    unseeded requests are (their generators seeded here, for a reproducible test)."""
    if scheme == "rejection":
        monkeypatch.setattr(sequence, "is_keyed", lambda p: False)
        monkeypatch.setattr(sampler, "is_keyed", lambda p: False)
    tok = AutoTokenizer.from_pretrained(bpe_models["target"])
    digits = [int(tok.convert_tokens_to_ids(str(d))) for d in range(5)]  # type: ignore[arg-type]
    prompt = tok("01234 3210 4")["input_ids"]
    params = SamplingParams(max_tokens=8, temperature=1.0, structured=StructuredOutput(regex="[0-4]{3}"))
    engine = load_engine(
        bpe_models["target"], drafters=[bpe_models["copy"]], block_size=4, num_blocks=2048, max_num_seqs=256
    )
    apply_decision(
        engine, Decision(version=1, policy="test", gamma_table=[(ALL_BATCHES, 3)], drafter=drafter)
    )
    reqs = [EngineRequest(str(i), prompt, params.model_copy(update={"seed": i})) for i in range(TRIALS)]
    run = drive(engine, reqs)
    if (drafter, scheme) == ("copy", "keyed"):  # coupled: what fits the grammar is the target's draw
        assert run.total("accepted") > 0.9 * run.total("proposed")
    else:
        assert 0 < run.total("accepted") < run.total("proposed"), "both acceptance and rejection must occur"
    assert all(len(t) == 3 and set(t) <= set(digits) for t in run.tokens.values())

    hf = hf_model(bpe_models["target"])
    ids = torch.tensor(digits)

    def masked(prefixes: list[list[int]]) -> torch.Tensor:  # [N, 5]
        with torch.inference_mode():
            return torch.softmax(hf(torch.tensor(prefixes)).logits[:, -1, ids].double(), -1)

    p1 = masked([prompt])[0]
    p2 = masked([[*prompt, a] for a in digits])
    p3 = masked([[*prompt, a, b] for a in digits for b in digits]).view(5, 5, 5)
    expected = (p1.view(5, 1, 1) * p2.view(5, 5, 1) * p3).sum(0) * TRIALS
    observed = torch.zeros(5, 5, dtype=torch.float64)
    for t in run.tokens.values():
        observed[digits.index(t[1]), digits.index(t[2])] += 1
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    result = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    assert result.pvalue > 1e-3, result
