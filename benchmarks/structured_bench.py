"""What structured output costs (docs/structured_output.md).

- ``grammar``: per tokenizer, the llguidance tokenizer's build (once per engine), one JSON
  schema's compile (once per schema: cached), the gateway's check, and one row's mask;
- ``engine``: greedy decoding of the same prompts on a model, plain and under a JSON schema,
  at γ = 0 and γ = 4 with the n-gram drafter: tokens per second side by side, and the
  draft acceptance under the grammar.

    .venv/bin/python -m benchmarks.structured_bench --model models/nj-target \
        --tokenizers models/nj-target models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import llguidance
import llguidance.hf
import torch
from transformers import AutoTokenizer

from shared.control import ALL_BATCHES, Decision
from shared.grammar import grammar_text, problem
from shared.schemas import SamplingParams
from shared.structured import StructuredOutput
from worker.engine.api import EngineRequest
from worker.engine.grammar import Constraint
from worker.engine.loader import load_engine
from worker.speculation import apply_decision

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {
            "type": "array",
            "items": {"enum": ["drama", "comedy", "horror", "sci-fi"]},
            "maxItems": 3,
        },
        "rating": {"type": "number"},
        "seen": {"type": "boolean"},
    },
    "required": ["title", "year", "genres", "seen"],
    "additionalProperties": False,
}
SPEC = StructuredOutput(json=SCHEMA)
PROMPTS = ["Once upon a time", "def fibonacci(n):", "The weather today", "A movie review:"] * 4


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def grammar_costs(path: str) -> None:
    tok = AutoTokenizer.from_pretrained(path)
    t0 = time.perf_counter()
    lt = llguidance.hf.from_tokenizer(tok, len(tok))  # type: ignore[arg-type]
    t1 = time.perf_counter()
    matcher = llguidance.LLMatcher(lt, grammar_text(SPEC))
    t2 = time.perf_counter()
    problem(StructuredOutput(json={**SCHEMA, "title": "uncached"}))
    t3 = time.perf_counter()
    c = Constraint(matcher, len(tok))
    c.allowed()  # the first mask builds the lexer
    text_ids = tok(
        '{"title": "Alien", "year": 1979, "genres": ["sci-fi", "horror"], "seen": true}',
        add_special_tokens=False,
    )["input_ids"]
    t4 = time.perf_counter()
    for t in text_ids:
        c.allowed()
        c.accept([t])
    per_row = (time.perf_counter() - t4) / len(text_ids)
    print(
        f"{path}: vocab {len(tok)}; tokenizer build {_ms(t1 - t0)} (once); compile {_ms(t2 - t1)} "
        f"(once per schema); gateway check {_ms(t3 - t2)}; mask + advance per row {_ms(per_row)}"
    )


def engine_rates(model: str, new: int) -> None:
    for gamma in (0, 4):
        rates = {}
        for name, params in (
            ("plain", SamplingParams(max_tokens=new, ignore_eos=True)),
            ("json", SamplingParams(max_tokens=new, structured=SPEC)),
        ):
            engine = load_engine(model, block_size=16)
            apply_decision(
                engine,
                Decision(version=1, policy="bench", gamma_table=[(ALL_BATCHES, gamma)], drafter="ngram"),
            )
            tok = engine.tokenizer
            for i, p in enumerate(PROMPTS):
                engine.add_request(EngineRequest(str(i), tok(p)["input_ids"], params))
            tokens = proposed = accepted = 0
            t0 = time.perf_counter()
            while engine.has_unfinished():
                stats = engine.step().stats
                tokens, proposed, accepted = (
                    tokens + stats.num_tokens,
                    proposed + stats.proposed,
                    accepted + stats.accepted,
                )
            rates[name] = tokens / (time.perf_counter() - t0)
            acc = f", acceptance {accepted / proposed:.2f}" if proposed else ""
            print(f"  γ={gamma} {name}: {tokens} tokens, {rates[name]:.0f} tokens/s{acc}")
        print(f"  γ={gamma}: json / plain tokens/s = {rates['json'] / rates['plain']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/nj-target")
    ap.add_argument("--tokenizers", nargs="*", default=["models/nj-target"])
    ap.add_argument("--new", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for path in args.tokenizers:
        grammar_costs(path)
    print(f"engine {args.model}, {len(PROMPTS)} prompts, batch of all:")
    engine_rates(args.model, args.new)


if __name__ == "__main__":
    main()
