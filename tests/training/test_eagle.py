"""EAGLE-style feature heads: the chained passes equal sequential drafting, and the whole
`train-eagle` pipeline runs end to end on a tiny random target in seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from tests.tiny_models import build_llama
from training.eagle import HeadRecipe, alpha_from_e, collate, select_vocab, train_head
from training.eagle_data import DataSpec, FeatureSeq
from training.eagle_head import EagleHead, HeadConfig
from training.eagle_pipeline import EagleOptions, load_head, run_train_eagle
from training.eagle_report import splice_eagle

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
CFG = HeadConfig(hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, rope_theta=10000.0,
                 target_vocab=50, draft_vocab=20)


def _head(seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    embed = torch.randn(CFG.target_vocab, CFG.hidden)
    return EagleHead(CFG, embed, torch.arange(0, 40, 2)).eval()


def test_chain_equals_sequential_drafting() -> None:
    head = _head()
    t = 9
    feats = torch.randn(1, t, CFG.hidden)
    tokens = torch.randint(0, CFG.target_vocab, (1, t + 2))
    with torch.no_grad():
        outs = head.chain(feats, tokens, steps=2)
        for i in range(t):
            # Real entries 0..i, then drafted entries fed the head's own outputs.
            f = feats[:, : i + 1]
            h1 = head.chain(f, tokens[:, : i + 1], 0)[0][:, -1:]
            f2 = torch.cat([f, h1], dim=1)
            h2 = head.chain(f2, tokens[:, : i + 2], 0)[0][:, -1:]
            f3 = torch.cat([f2, h2], dim=1)
            h3 = head.chain(f3, tokens[:, : i + 3], 0)[0][:, -1:]
            torch.testing.assert_close(outs[0][:, i], h1[:, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(outs[1][:, i], h2[:, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(outs[2][:, i], h3[:, 0], atol=1e-5, rtol=1e-5)


def _seqs(n: int, seed: int) -> list[FeatureSeq]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 20, (1,), generator=g))
        toks = torch.randint(0, CFG.target_vocab, (length,), generator=g).tolist()
        out.append(FeatureSeq(toks, 3, torch.randn(length - 1, CFG.hidden, generator=g).half()))
    return out


def test_training_is_deterministic_and_learns() -> None:
    seqs = _seqs(6, 1)
    recipe = HeadRecipe(name="t", train_sets=(), steps=12, batch_size=4, lr=5e-3, warmup=2)
    a, b = _head(3), _head(3)
    ra = train_head(a.train(), seqs, [], recipe, seed=7, progress=False)
    rb = train_head(b.train(), seqs, [], recipe, seed=7, progress=False)
    assert ra.last_loss == rb.last_loss
    assert ra.last_loss < ra.first_loss
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_vocab_ranks_generated_tokens_first() -> None:
    s = FeatureSeq([1, 2, 3, 7, 7, 7, 9], 3, torch.zeros(6, 4).half())
    assert select_vocab([s], 2, 12).tolist() == [7, 9]
    assert select_vocab([s], 4, 12).tolist() == [1, 2, 7, 9]
    feats, tokens, lens, _ = collate([s], 2, 100)
    assert feats.shape == (1, 9, 4) and tokens.shape == (1, 8) and int(lens[0]) == 7


def test_alpha_inverts_expected_tokens() -> None:
    for a in (0.1, 0.5, 0.8):
        for g in (1, 4, 8):
            e = (1 - a ** (g + 1)) / (1 - a)
            assert abs(alpha_from_e(e, g) - a) < 1e-6


def test_train_eagle_end_to_end_on_a_tiny_target(tmp_path: Path) -> None:
    target = build_llama(tmp_path / "tiny-target", layers=2, hidden=64)
    spec = DataSpec(chat_prompts=3, code_prompts=3, more_chat=2, more_sharegpt=2, more_code=2, new_tokens=12,
                    eval_prompts=2, eval_new_tokens=10)
    opts = EagleOptions(out=tmp_path / "models", data=DATA, target_dir=target, steps=3, draft_vocab=64,
                        spec=spec, cache_dir=tmp_path / "cache")
    logs: list[str] = []
    res = run_train_eagle(opts, logs.append)
    assert set(res) == {"smol-eagle-chat", "smol-eagle-code"}
    for name, meta in res.items():
        d = opts.out / name
        cfg = json.loads((d / "config.json").read_text())
        assert cfg["num_hidden_layers"] == 1 and cfg["nightjar_feature_drafter"]["draft_vocab_size"] == 64
        assert set(meta["eval"]) == {"chat", "sharegpt", "code"}
        assert set(meta["eval"]["code"]) == {1, 2, 4, 8}
        assert set(meta["ngram_eval"]) == {"chat", "sharegpt", "code"}
        e = meta["eval"]["chat"][4]["E"]
        assert 1.0 <= e <= 5.0
        from training.checkpoint import load_model

        tm = load_model(target)
        head = load_head(d, tm.model.embed_tokens.weight.detach(), tm.lm_head.weight.detach())
        assert head.vocab_ids.numel() == 64
    # The second run (one head) finds every set it needs in the cache and generates nothing.
    again: list[str] = []
    res = run_train_eagle(replace(opts, heads=("smol-eagle-chat",)), again.append)
    assert set(res) == {"smol-eagle-chat"}
    assert sum("cached continuations" in line for line in again) == 8  # all but code-train-2
    # The MODELS.md section is spliced into an existing file, the rest left alone.
    md = tmp_path / "MODELS.md"
    md.write_text("# Bundled models\n\nother text\n")
    assert splice_eagle(opts.out, md) and splice_eagle(opts.out, md)
    text = md.read_text()
    assert text.startswith("# Bundled models\n\nother text\n") and text.count("feature drafters") == 1
    assert "| `smol-eagle-chat` | code |" in text and "| `ngram` | chat |" in text
