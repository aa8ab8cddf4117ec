"""The engine the worker runs (whatever the factory returns) against transformers itself."""

from __future__ import annotations

from pathlib import Path

from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.tiny_models import build_llama, reference_greedy
from worker.engine.api import Engine, EngineRequest, RequestOutput
from worker.engine.engine import LLMEngine
from worker.engine_factory import create_engine
from worker.prompts import PromptEncoder
from worker.service import WorkerService
from worker.settings import WorkerSettings
from worker.speculation import apply_decision

PROMPTS = ["The quick brown", "Once upon a time", "Héllo 東京", "Redis"]


def _drain(engine: Engine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for o in engine.step().outputs:
            outs.setdefault(o.request_id, []).append(o)
    return outs


def _tokens(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_greedy_equals_transformers_generate(engine: Engine, prompts: PromptEncoder, model_dir: Path) -> None:
    ids = [prompts.tokenizer(p)["input_ids"] for p in PROMPTS]
    for i, p in enumerate(ids):
        engine.add_request(EngineRequest(str(i), p, SamplingParams(max_tokens=12 + i)))
    outs = _drain(engine)
    for i, p in enumerate(ids):
        assert _tokens(outs[str(i)]) == reference_greedy(model_dir, p, 12 + i)
        assert outs[str(i)][-1].finished and outs[str(i)][-1].num_prompt_tokens == len(p)


def test_seeded_sampling_reproduces(model_dir: Path, prompts: PromptEncoder) -> None:
    p = prompts.tokenizer("Once upon")["input_ids"]
    runs = []
    for seed in (1, 1, 2):
        engine = create_engine(model_dir, num_blocks=64)
        params = SamplingParams(
            max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=seed, ignore_eos=True
        )
        engine.add_request(EngineRequest("s", p, params))
        runs.append(_tokens(_drain(engine)["s"]))
    assert runs[0] == runs[1] and len(runs[0]) == 16
    assert runs[0] != runs[2]


def test_abort_finishes_as_cancelled(engine: Engine, prompts: PromptEncoder) -> None:
    engine.add_request(
        EngineRequest("a", prompts.tokenizer("x")["input_ids"], SamplingParams(max_tokens=500))
    )
    engine.step()
    engine.abort_request("a")
    engine.abort_request("unknown")  # ignored
    last = engine.step().outputs[-1]
    assert last.finished and last.finish_reason == "cancelled" and last.num_output_tokens == 1
    assert not engine.has_unfinished()


def test_eos_stops_unless_ignored(engine: Engine, prompts: PromptEncoder) -> None:
    p = prompts.tokenizer("Once")["input_ids"]
    engine.add_request(EngineRequest("probe", p, SamplingParams(max_tokens=3)))
    third = _tokens(_drain(engine)["probe"])[2]
    engine.eos_token_ids = frozenset({third})  # pretend the model's third token is its EOS
    engine.add_request(EngineRequest("eos", p, SamplingParams(max_tokens=10)))
    engine.add_request(EngineRequest("ign", p, SamplingParams(max_tokens=10, ignore_eos=True)))
    outs = _drain(engine)
    assert outs["eos"][-1].finish_reason == "stop" and len(_tokens(outs["eos"])) == 3
    assert outs["ign"][-1].finish_reason == "length" and len(_tokens(outs["ign"])) == 10


def test_decision_applies_without_restart(engine: Engine, prompts: PromptEncoder) -> None:
    apply_decision(engine, Decision(version=5, policy="static"))
    engine.add_request(EngineRequest("d", prompts.tokenizer("x")["input_ids"], SamplingParams(max_tokens=1)))
    assert engine.step().stats.decision_version == 5


def test_worker_settings_name_the_drafters_and_speculation_stays_exact(
    model_dir: Path, prompts: PromptEncoder, tmp_path: Path
) -> None:
    drafter = build_llama(tmp_path / "tiny-draft", layers=1, hidden=32, seed=1)
    settings = WorkerSettings(model_dir=str(model_dir), drafters=[str(drafter)], engine={"num_blocks": 64})
    engine = WorkerService(settings, prompts=prompts).engine
    assert isinstance(engine, LLMEngine) and engine.drafter_names == ["tiny-draft", "ngram"]
    for drafter_name in ("tiny-draft", "ngram"):
        apply_decision(
            engine, Decision(version=1, policy="static", gamma_table=[(ALL_BATCHES, 3)], drafter=drafter_name)
        )
        ids = [prompts.tokenizer(p)["input_ids"] for p in PROMPTS]
        for i, p in enumerate(ids):
            engine.add_request(EngineRequest(f"{drafter_name}{i}", p, SamplingParams(max_tokens=10)))
        outs = _drain(engine)
        for i, p in enumerate(ids):
            assert _tokens(outs[f"{drafter_name}{i}"]) == reference_greedy(model_dir, p, 10)
    settings = WorkerSettings(
        model_dir=str(model_dir), engine={"num_blocks": 8, "drafters": [], "ngram": False}
    )
    assert WorkerService(settings, prompts=prompts).engine.drafter_names == []  # type: ignore[attr-defined]
