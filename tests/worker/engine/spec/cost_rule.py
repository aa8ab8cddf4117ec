"""The cost rule's test bench (test_plan.py, test_scoring.py): the bundled nj-target with its
two trained drafters (nj-draft-code: ~0.73 accepted on code, ~0.08 on stories; nj-draft-prose
the reverse, MODELS.md) and n-gram, under a decision whose step costs make speculation cheap up
to batch 4 and dear from batch 8."""

from __future__ import annotations

from pathlib import Path

from shared.control import ALL_BATCHES, Decision, StepCosts
from shared.schemas import SamplingParams
from worker.engine.api import EngineRequest
from worker.engine.engine import LLMEngine
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

MODELS = Path(__file__).resolve().parents[4] / "models"
CODE, PROSE = "nj-draft-code", "nj-draft-prose"
DRAFTERS = (CODE, PROSE, "ngram")
CODE_PROMPTS = ["def fibonacci(n):\n    ", "import os\n\ndef read_lines(path):\n    "]
STORY_PROMPTS = ["Once upon a time there was a little fox who", "Tom and Lily went to the park to"]
PLAIN = Decision(version=1, policy="t", gamma_table=[(ALL_BATCHES, 0)])  # γ = 0 throughout


def cheap_costs(cheap_upto: int = 4, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> list[StepCosts]:
    """A plain step costs 1; a speculative one 1.1 + 0.05·γ up to ``cheap_upto`` sequences,
    then 3 + γ (the verify forward compute-bound)."""
    out = []
    for b in batches:
        cheap = b <= cheap_upto
        spec = [(1.1 + 0.05 * g) if cheap else (3.0 + g) for g in range(1, 5)]
        out.append(StepCosts(batch=b, plain_s=1.0, spec_s={d: list(spec) for d in DRAFTERS}))
    return out


def rule_decision(version: int = 1, hold: int = 4, **kw: object) -> Decision:
    return Decision(
        version=version,
        policy="t",
        gamma_table=[(ALL_BATCHES, 0)],
        drafter_scope="request",
        step_costs=cheap_costs(),
        acceptance={d: 0.4 for d in DRAFTERS},
        acceptance_hi={d: 0.6 for d in DRAFTERS},
        hold_steps=hold,
        **kw,  # type: ignore[arg-type]
    )


def nj_engine() -> LLMEngine:
    return load_engine(MODELS / "nj-target", drafters=[MODELS / CODE, MODELS / PROSE], num_blocks=512)


def params(n: int = 32) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def drain(
    engine: LLMEngine, prompts: dict[str, str], decision: Decision
) -> tuple[dict[str, list[int]], dict]:
    apply_decision(engine, decision)
    tok = engine.tokenizer
    for rid, text in prompts.items():
        engine.add_request(EngineRequest(rid, tok.encode(text), params()))
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    first: dict[str, str | None] = {}
    steps = []
    while engine.has_unfinished():
        result = engine.step()
        engine.check_integrity()
        steps.append(result.stats)
        for rid, seq in engine._seqs.items():
            if seq.spec.prompt_scored and rid not in first:
                first[rid] = seq.spec.drafter
        for o in result.outputs:
            out[o.request_id] += o.new_token_ids
    return out, {"first": first, "steps": steps}
