"""The startup cost profile on the tiny models: complete, sane, leaves the engine clean."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import pytest

from shared.control import Decision
from shared.profile import CostProfile
from shared.schemas import SamplingParams
from tests.tiny_models import build_llama, reference_greedy
from worker.engine.api import Engine, EngineRequest, StepResult
from worker.engine_factory import create_engine
from worker.profile_table import envelope
from worker.profiling import PROFILE_ID, Interrupted, ProfileSettings, Stopped, profile_engine
from worker.speculation import apply_decision

FAST = ProfileSettings(max_batch=4, reps=2)


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("profile-draft") / "tiny-draft", layers=1, hidden=32, seed=1)


@pytest.fixture
def spec_engine(model_dir: Path, drafter_dir: Path) -> Engine:
    return create_engine(model_dir, drafters=[drafter_dir], num_blocks=256)


def _generate(engine: Engine, rid: str, prompt: list[int], n: int) -> list[int]:
    engine.add_request(EngineRequest(rid, prompt, SamplingParams(max_tokens=n, ignore_eos=True)))
    out: list[int] = []
    for _ in range(10 * n):
        for o in engine.step().outputs:
            if o.request_id == rid:
                out += o.new_token_ids
                if o.finished:
                    return out
    raise AssertionError("the request never finished")


def test_profile_is_complete_and_sane(
    spec_engine: Engine, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats: list[Any] = []
    step = spec_engine.step

    def recorded() -> StepResult:
        result = step()
        stats.append(result.stats)
        return result

    monkeypatch.setattr(spec_engine, "step", recorded)
    profile = profile_engine(spec_engine, "tiny", FAST, worker_id="w1")
    # It times forwards: no step scored the other drafters (what that costs a served step
    # the planner learns from telemetry).
    assert any(s.gamma > 0 for s in stats)
    assert all(s.counterfactual_time == 0.0 and set(s.counterfactual) <= {s.drafter} for s in stats)
    assert isinstance(profile, CostProfile)
    assert CostProfile.loads(profile.dumps()) == profile
    assert profile.batches == [1, 2, 4] and profile.rows == [1, 2, 3, 4, 5]
    assert set(profile.drafter_s) == set(profile.catch_up_s) == {"tiny-draft", "ngram"}
    assert (profile.model, profile.worker_id, profile.source) == ("tiny", "w1", "startup")
    assert profile.weights == spec_engine.weights == "float32"  # what was measured is what is served
    assert profile.num_blocks == 256 and 0 < profile.measure_s < FAST.budget_s
    assert all(v > 0 for row in profile.target_s for v in row)
    assert all(v > 0 for vs in profile.drafter_s.values() for v in vs)
    # sane: verifying five rows for four sequences costs more than one row for one
    assert profile.target(4, 5) > profile.target(1, 1)
    # and the target again at a longer context, the same shape (FAST: prompts of 16 and 128)
    assert 16 < profile.context < 16 + 40 and 128 < profile.long_context < 128 + 40
    assert len(profile.long_target_s) == 3 and all(len(r) == 5 for r in profile.long_target_s)
    assert profile.target(4, 1, profile.long_context) == pytest.approx(profile.long_target_s[2][0])
    # the engine is left as it was: nothing of the profile's runs on, output stays exact
    prompt = [5, 6, 7, 8, 9]
    assert _generate(spec_engine, "real", prompt, 6) == reference_greedy(
        model_dir, prompt, 6, ignore_eos=True
    )
    assert not spec_engine.has_unfinished()


def test_without_drafters_only_plain_steps(model_dir: Path) -> None:
    engine = create_engine(model_dir, ngram=False, num_blocks=128)
    profile = profile_engine(engine, "tiny", FAST)
    assert profile is not None and profile.rows == [1] and profile.drafter_s == {}


def test_no_budget_no_profile(engine: Engine) -> None:
    assert profile_engine(engine, "tiny", ProfileSettings(budget_s=1e-9)) is None
    assert _generate(engine, "after", [3, 4, 5], 2)  # the aborted synthetic requests are gone
    assert not engine.has_unfinished()


class _Stopping:
    """An engine proxy that sets ``stop`` at its ``at``-th step (SIGTERM mid-profile)."""

    def __init__(self, engine: Engine, at: int, stop: threading.Event) -> None:
        self.engine, self.at, self.stop, self.steps = engine, at, stop, 0

    def step(self) -> StepResult:
        self.steps += 1
        if self.steps == self.at:
            self.stop.set()
        return self.engine.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_a_stop_ends_the_pass_at_the_next_step_and_leaves_the_engine_clean(engine: Engine) -> None:
    stop = threading.Event()
    proxy = _Stopping(engine, 5, stop)
    endless = ProfileSettings(max_batch=4, reps=1000, budget_s=3600)
    with pytest.raises(Stopped):
        profile_engine(cast(Engine, proxy), "tiny", endless, stop=stop)
    assert proxy.steps <= 5 + 4  # the step that saw it, then at most the clearing steps
    assert _generate(engine, "after", [3, 4, 5], 2)  # (it applies the decision restored)
    assert not engine.has_unfinished()  # every synthetic request was aborted


class _Arriving:
    """An engine proxy that receives a real request at the ``at``-th profiling step."""

    def __init__(self, engine: Engine, at: int, request: EngineRequest) -> None:
        self.engine, self.at, self.request, self.steps = engine, at, request, 0

    def step(self) -> StepResult:
        self.steps += 1
        if self.steps == self.at:
            self.engine.add_request(self.request)
        return self.engine.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def test_a_real_request_interrupts_and_loses_nothing(spec_engine: Engine, model_dir: Path) -> None:
    prompt = [7, 8, 9, 10]
    req = EngineRequest("job", prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    proxy = _Arriving(spec_engine, 6, req)
    with pytest.raises(Interrupted) as info:
        profile_engine(cast(Engine, proxy), "tiny", FAST)
    tokens = [t for o in info.value.outputs for t in o.new_token_ids]
    assert {o.request_id for o in info.value.outputs} == {"job"}
    done = False
    for _ in range(50):  # the engine goes on with the job; the synthetic requests are aborted
        result = spec_engine.step()
        for o in result.outputs:
            if o.request_id == "job":
                tokens += o.new_token_ids
                done = o.finished
            else:
                assert o.request_id.startswith(PROFILE_ID) and o.finish_reason == "cancelled"
        if done:
            break
    assert done and tokens == reference_greedy(model_dir, prompt, 6, ignore_eos=True)


def test_offloaded_engine_is_measured_at_gamma_zero_and_stays_offloaded(spec_engine: Engine) -> None:
    apply_decision(spec_engine, Decision(version=1, policy="test", offload=True))
    stats = spec_engine.step().stats
    for _ in range(200):  # the weights move in the background
        if not stats.draft_resident:
            break
        stats = spec_engine.step().stats
    assert not stats.draft_resident
    profile = profile_engine(
        spec_engine,
        "tiny",
        FAST,
        offloaded=True,
        restore=lambda: Decision(version=1, policy="test", offload=True),
    )
    assert profile is not None and profile.rows == [1] and profile.drafter_s == {}
    assert not spec_engine.step().stats.draft_resident


def test_the_envelope_keeps_the_least_time_of_any_larger_point() -> None:
    """Noise only adds time, and more rows or a larger batch never take less: a point measured
    above one of those takes that one's time (nj-target at batch 4, one pass: 7.9 ms for 4
    rows, 8.6 for 5, 6.8 for 3 — and 6.7 for 4 rows at batch 8)."""
    table = [[4.2, 6.3, 6.8, 7.9, 8.6], [5.0, 7.9, 9.2, 6.7, 11.5]]
    assert envelope(table) == [[4.2, 6.3, 6.7, 6.7, 8.6], [5.0, 6.7, 6.7, 6.7, 11.5]]
    assert envelope([[1.0], [0.5], [2.0]]) == [[0.5], [0.5], [2.0]]


def test_a_gguf_served_engine_profiles_its_own_precision(model_dir: Path, tmp_path: Path) -> None:
    """The profile times the engine as served: a directory holding a Q4_1 GGUF file is
    measured on its blocks, and says so (the planner's prior follows the precision)."""
    from gguf import GGMLQuantizationType

    from tests.worker.engine.gguf_file import write_gguf
    from tests.worker.engine.tiny import hf_model

    write_gguf(hf_model(model_dir), tmp_path / "tiny.gguf", GGMLQuantizationType.Q4_1)
    engine = create_engine(tmp_path, drafters=[], num_blocks=64)
    profile = profile_engine(engine, "tiny-q4", ProfileSettings(max_batch=2, reps=1, long_prompt_len=0))
    assert profile is not None and profile.weights == engine.weights == "Q4_1"
    assert profile.batches == [1, 2] and all(v > 0 for row in profile.target_s for v in row)
