"""worker.engine.grammar: the mask along a drafted path (and back), the cut at the grammar's
end, the rollback of a failed step, the compile cache, and refusals as the request's fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.errors import ErrorCode
from shared.schemas import SamplingParams
from shared.structured import StructuredOutput
from tests.tiny_models import build_tokenizer
from tests.worker.engine.drive import drive
from worker.engine.api import EngineRequest
from worker.engine.grammar import GrammarError, Grammars
from worker.engine.loader import load_engine

TOK = build_tokenizer()
EOS = TOK.eos_token_id
V = len(TOK) + 5  # model rows wider than the tokenizer


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def grammars() -> Grammars:
    return Grammars(V, frozenset({EOS}))


def test_rows_are_masked_along_the_drafts_and_the_matcher_goes_back() -> None:
    c = grammars().start(StructuredOutput(regex="ab(c|d)"), TOK, [])
    a, b, c_, d = (ids(x)[0] for x in "abcd")
    rows = torch.zeros(4, V)
    c.mask_rows(rows, [a, b, a], rows.clone())
    allowed = [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in rows]
    assert allowed[0] == {a} and allowed[1] == {b} and allowed[2] == {c_, d}
    assert allowed[3] == set(range(V)), "after a refused draft the rows are left as they are"
    assert c.consumed == 0 and c.allowed().nonzero().flatten().tolist() == [a]  # walked back
    assert c.fitting([a, b, d, a]) == 3 and c.fitting([b]) == 0 and c.consumed == 0  # drafting's cut
    assert not c.allowed()[len(TOK) :].any()


def test_accept_cuts_after_the_grammar_ends_and_sync_rolls_back() -> None:
    c = grammars().start(StructuredOutput(choice=["yes"]), TOK, [])
    toks = ids("yes")
    assert c.accept([*toks, EOS]) == len(toks) and c.done  # EOS after the end is not output
    c.sync(0)
    assert not c.done and c.consumed == 0 and c.accept(toks) == len(toks)
    with pytest.raises(GrammarError):
        grammars().start(StructuredOutput(choice=["yes"]), TOK, []).accept(ids("no"))


def test_a_resumed_prefix_is_taken_first_and_compiles_are_cached() -> None:
    g = grammars()
    spec = StructuredOutput(regex="[a-c]+x")
    c = g.start(spec, TOK, ids("ab"))
    assert c.consumed == 0 and not c.done
    assert g.start(spec, TOK, []) is not c and len(g._compiled) == 1
    with pytest.raises(GrammarError, match="past the end"):
        g.start(StructuredOutput(choice=["a"]), TOK, ids("a") + ids("b"))


def test_refusals_are_bad_requests(llama_dir: Path) -> None:
    """A model without a tokenizer, and a grammar the engine refuses, end the request alone
    with ``bad_request`` (a 400); the others run."""
    engine = load_engine(llama_dir, block_size=4, num_blocks=64)  # the tiny checkpoint ships no tokenizer
    structured = SamplingParams(max_tokens=4, structured=StructuredOutput(json_object=True))
    run = drive(
        engine,
        [
            EngineRequest("s", [1, 5, 7], structured),
            EngineRequest("p", [1, 5, 7], SamplingParams(max_tokens=4)),
        ],
    )
    assert run.finals["s"].error_code is ErrorCode.BAD_REQUEST and "no tokenizer" in (
        run.finals["s"].error or ""
    )
    assert run.finals["p"].finish_reason == "length"
    with pytest.raises(GrammarError, match="refused"):
        grammars().start(StructuredOutput(grammar="start: ("), TOK, [])
