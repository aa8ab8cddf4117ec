"""Elastic memory: weights leave and come back intact (the fused decode path follows them), the
target's pool grows by exactly the freed bytes and shrinks back, γ stays 0 until the reload is
complete, and the drafters then catch up (a measured switching cost)."""

from __future__ import annotations

from pathlib import Path

import torch

from nj_kernels import cpu_decode
from shared.control import ALL_BATCHES, Decision
from shared.schemas import SamplingParams
from tests.worker.engine.prompts import PROMPTS
from tests.worker.engine.spec.drafting import make_drafter
from worker.engine.api import Engine, EngineRequest, StepStats
from worker.engine.kv_cache import bytes_per_block
from worker.engine.loader import load_engine
from worker.engine.spec.residency import WeightMover, _slots
from worker.speculation import apply_decision


def test_weights_round_trip_through_host_memory(tiny_models: dict[str, Path]) -> None:
    drafter = make_drafter(tiny_models["llama3_tied"])
    model = drafter.runner.model
    before = [getattr(o, a).clone() for o, a in _slots(model)]
    fused = model.fused_layers()  # the fused C path binds the tensors it was built on
    mover = WeightMover(model)
    assert mover.nbytes == drafter.weight_bytes
    mover.start(to_host=True)
    assert mover.done()  # on a CPU the offload is one synchronous copy
    mover.finish()
    assert mover.on_host and model.lm_head is model.embed  # tied weights stay tied
    if cpu_decode.available():  # bound again to the moved tensors
        assert fused is not None
        rebound = model.fused_layers()
        assert rebound is not None and rebound is not fused
        assert rebound._tensors[0] is model.layers[0].input_norm
    mover.start(to_host=False)  # a background thread on a CPU
    while not mover.done():
        pass
    assert mover.finish() >= 0 and not mover.on_host
    after = [getattr(o, a) for o, a in _slots(model)]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def _decide(engine: Engine, version: int, gamma: int, offload: bool) -> None:
    apply_decision(
        engine, Decision(version=version, policy="test", gamma_table=[(ALL_BATCHES, gamma)], offload=offload)
    )


def test_offload_grows_the_pool_and_reload_gives_it_back(spec_models: dict[str, Path]) -> None:
    engine = load_engine(
        spec_models["target"],
        drafters=[spec_models["copy"], spec_models["layer0"]],
        block_size=4,
        num_blocks=40,
    )
    models = engine.spec.pool.models if engine.spec.pool else []
    freed = sum(d.weight_bytes + d.kv_bytes for d in models)
    per_block = bytes_per_block(engine.runner.config, 4, torch.float32)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    for i, p in enumerate(PROMPTS[:3]):
        engine.add_request(EngineRequest(str(i), p, params))
    _decide(engine, 1, 2, False)
    for _ in range(3):
        assert engine.step().stats.gamma in (0, 2)
    _decide(engine, 2, 2, True)
    stats = engine.step().stats
    (event,) = stats.memory_events
    assert event.kind == "offload" and event.bytes == freed
    assert event.to_blocks - event.from_blocks == freed // per_block == stats.total_blocks - 40
    assert not stats.draft_resident and stats.gamma == 0 and stats.proposed == 0
    assert all(d.runner.cache.num_blocks == 0 and not d.computed for d in models)
    for _ in range(3):
        stats = engine.step().stats
        assert stats.gamma == 0 and not stats.draft_resident
    _decide(engine, 3, 2, False)
    seen: list[StepStats] = [engine.step().stats]  # this step shrinks the pool, starts the copy back
    while not all(m.done() for m in engine.memory.movers):  # let the background copy finish, so no
        pass  # sequence runs out of tokens first on a slow machine
    while not seen[-1].draft_resident:
        seen.append(engine.step().stats)
    reload = [e for s in seen for e in s.memory_events]
    assert [e.kind for e in reload] == ["reload"]
    assert reload[0].to_blocks == 40 and reload[0].seconds >= 0 and reload[0].kv_seconds >= 0
    assert all(s.gamma == 0 for s in seen[:-1])
    assert all(d.runner.cache.num_blocks == 40 for d in models)
    resumed = seen[-1]  # the reload completed at the start of this step: it speculates
    assert resumed.gamma == 2 and resumed.proposed > 0
    (cost,) = resumed.switch_costs
    assert cost.drafter == "copy" and cost.batch_size == 3 and cost.tokens > len(PROMPTS[0])
