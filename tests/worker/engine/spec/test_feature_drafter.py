"""The feature drafter on its own: the engine's FeatureModel drafts exactly what the training
head (``training.eagle_head.EagleHead``) drafts; rollback, catch-up, scoring and the bound on
pending features keep its state consistent."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.schemas import SamplingParams
from tests.tiny_models import build_llama
from tests.worker.engine.spec.feature_heads import make_head, target_features
from training.eagle_head import EagleHead
from worker.engine.keyed import keyed_draw
from worker.engine.loader import load_engine
from worker.engine.sequence import Sequence
from worker.engine.spec.feature_drafter import FeatureDrafter
from worker.engine.spec.feature_model import is_feature_drafter, load_feature_runner


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_llama(tmp_path_factory.mktemp("fd") / "target", layers=2, hidden=64)


def head_chain(head: EagleHead, feats: torch.Tensor, tokens: list[int], length: int, k: int) -> list[int]:
    """Greedy chain of k drafts after ``tokens[:length]`` with the training head."""
    f = feats[None, : length - 1]
    x = torch.tensor([tokens[1:length]])
    out = []
    with torch.no_grad():
        for _ in range(k):
            h = head.chain(f, x, 0)[0][:, -1:]
            d = int(head.vocab_ids[head.logits(h[0, 0]).argmax()])
            out.append(d)
            f, x = torch.cat([f, h], 1), torch.cat([x, torch.tensor([[d]])], 1)
    return out


def drafter(target: Path, head_dir: Path, **kw: int) -> FeatureDrafter:
    engine = load_engine(target, drafters=[], ngram=False, num_blocks=64, block_size=4)
    runner = load_feature_runner(head_dir, engine.runner, 4)
    runner.cache.resize(64, [])
    return FeatureDrafter("fd", runner, **kw)


def seq(tokens: list[int], sid: str = "a", temperature: float = 0.0, seed: int | None = 1) -> Sequence:
    return Sequence(sid, list(tokens), SamplingParams(temperature=temperature, seed=seed))


def test_drafts_equal_the_training_head(target_dir: Path, tmp_path: Path) -> None:
    head_dir, head = make_head(target_dir, tmp_path / "head")
    assert is_feature_drafter(head_dir) and not is_feature_drafter(target_dir)
    tokens = torch.randint(3, 300, (30,), generator=torch.Generator().manual_seed(0)).tolist()
    feats = target_features(target_dir, tokens)
    d = drafter(target_dir, head_dir)
    s = seq(tokens[:12])
    d.observe("a", 0, feats[:11])
    got = d.propose([s], [5]).tokens[0]
    assert got == head_chain(head, feats, tokens, 12, 5)
    # The target verified: keep 3 more real tokens (rollback to 14 computed), features arrive.
    s.token_ids = tokens[:16]
    d.observe("a", 11, feats[11:16])  # the verify rows: positions 11..15
    d.rollback("a", 15)
    assert d.pending["a"].end == 15
    got = d.propose([s], [3]).tokens[0]
    assert got == head_chain(head, feats, tokens, 16, 3)
    # Counterfactual scores: the prediction for each position j from entry j − 2.
    s.token_ids = tokens[:20]
    d.observe("a", 15, feats[15:19])
    d2 = drafter(target_dir, head_dir)
    s2 = seq(tokens[:20], "b")
    d2.observe("b", 0, feats[:19])
    sc = d2.score([s2], [16]).tokens[0]
    assert sc == [head_chain(head, feats, tokens, j, 1)[0] for j in range(16, 20)]
    d.free("a")
    assert not d.pending and not d.base and d.blocks.num_free_blocks == 64


def test_catch_up_and_prefix_start(target_dir: Path, tmp_path: Path) -> None:
    head_dir, head = make_head(target_dir, tmp_path / "head", seed=1)
    tokens = torch.randint(3, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    feats = target_features(target_dir, tokens)
    d = drafter(target_dir, head_dir)
    s = seq(tokens[:25])
    d.observe("a", 0, feats[:10])
    d.observe("a", 10, feats[10:24])  # γ = 0 steps: the features wait
    assert d.pending_rows("a") == 24 and d.lag(s) == 24
    done = d.catch_up([s])
    assert done.tokens == 23 and done.batch_size == 1
    assert d.lag(s) <= 1  # at most the newest row, waiting for its next token
    assert d.propose([s], [2]).tokens[0] == head_chain(head, feats, tokens, 25, 2)
    # A sequence whose first features start late (a prefix hit): its context starts there.
    d.observe("p", 8, feats[8:24])
    assert d.base["p"] == 8
    assert len(d.propose([seq(tokens[:25], "p")], [2]).tokens[0]) == 2
    # A gap restarts the context; the bound drops the oldest rows.
    d.observe("p", 30, feats[30:35])
    assert d.base["p"] == 30 and d.real["p"] == 0
    small = drafter(target_dir, head_dir, max_pending=6)
    small.observe("c", 0, feats[:20])  # past the bound: the newest half stays
    assert small.pending_rows("c") == 3 and small.base["c"] == 17
    for p in range(20, 24):  # then one row a step (γ = 0): never more than the bound
        small.observe("c", p, feats[p : p + 1])
        assert small.pending_rows("c") <= 6 and small.base["c"] + small.pending_rows("c") == p + 1
    assert small.catch_up([seq(tokens[:26], "c")]).tokens <= 6


def test_sampled_drafts_carry_q_over_the_drafters_vocabulary(target_dir: Path, tmp_path: Path) -> None:
    """Unseeded: q for rejection sampling. Seeded: keyed draws from the same q."""
    head_dir, head = make_head(target_dir, tmp_path / "head", seed=2)
    tokens = torch.randint(3, 300, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    feats = target_features(target_dir, tokens)
    d = drafter(target_dir, head_dir)
    d.observe("k", 0, feats[:11])
    keyed = d.propose([seq(tokens[:12], "k", temperature=0.8)], [3])
    kq = keyed.probs[0]
    assert kq is not None and kq.shape == (3, head.cfg.target_vocab) and len(keyed.tokens[0]) == 3
    assert set(keyed.tokens[0]) <= set(head.vocab_ids.tolist())
    assert keyed.tokens[0] == keyed_draw(kq, [1] * 3, [0, 1, 2])  # output positions 0..2
    s = seq(tokens[:12], temperature=0.8, seed=None)
    d.observe("a", 0, feats[:11])
    prop = d.propose([s], [3])
    q = prop.probs[0]
    assert q is not None and q.shape == (3, head.cfg.target_vocab)
    outside = torch.ones(head.cfg.target_vocab, dtype=torch.bool)
    outside[head.vocab_ids] = False
    assert float(q[:, outside].sum()) == 0.0
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    assert all(q[i, t] > 0 for i, t in enumerate(prop.tokens[0]))
