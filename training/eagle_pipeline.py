"""`nightjar models train-eagle`: feature heads for SmolLM2, from its own continuations and features.

The target's generations and features are made once (``eagle_data``, cached on disk) and serve
every head and the evaluation. Each head is saved as an HF-style directory (``config.json`` +
bfloat16 ``model.safetensors`` + ``nightjar_meta.json``) holding only its own weights and its
vocabulary's ids: the embedding and output rows are the target's, gathered at load.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file

from training.checkpoint import load_model, load_tokenizer
from training.corpus import DataError
from training.eagle import HeadRecipe, TrainResult, coverage, measure, ngram_measure, select_vocab, train_head
from training.eagle_data import CACHE_DIR, DataSpec, FeatureSeq, target_sets
from training.eagle_head import EagleHead, HeadConfig
from training.eagle_report import splice_eagle
from training.smollm2 import export_smollm2

Log = Callable[[str], None]
DATA_SPEC = DataSpec()
META = "nightjar_meta.json"
EVAL_DOMAINS = ("chat", "sharegpt", "code")
CHAT_SETS = ("chat-train", "sharegpt-train", "chat-train-2", "sharegpt-train-2")
CODE_SETS = ("code-train", "code-train-2")
HEADS = (
    HeadRecipe(name="smol-eagle-chat", train_sets=CHAT_SETS, other_sets=("code-train",), steps=800),
    HeadRecipe(name="smol-eagle-code", train_sets=CODE_SETS, other_sets=CHAT_SETS, steps=800),
)
_LAYER = {  # EagleHead attribute -> the engine's (HF Llama) name under model.layers.0.
    "input_norm": "input_layernorm.weight", "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight", "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}


@dataclass(frozen=True)
class EagleOptions:
    out: Path
    data: Path
    target_dir: Path
    seed: int = 0
    steps: int | None = None  # override every head's step count
    threads: int = 1
    draft_vocab: int = 8192
    spec: DataSpec = DATA_SPEC
    cache_dir: Path = CACHE_DIR
    stdlib_root: str | None = None
    heads: tuple[str, ...] = ()  # train only these (default: every head of HEADS)


def head_config(target_cfg: Any, draft_vocab: int) -> HeadConfig:
    rope = getattr(target_cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(target_cfg, "rope_theta", 10000.0)))
    hidden, heads = int(target_cfg.hidden_size), int(target_cfg.num_attention_heads)
    return HeadConfig(hidden=hidden, intermediate=int(target_cfg.intermediate_size), heads=heads,
                      kv_heads=int(target_cfg.num_key_value_heads),
                      head_dim=int(getattr(target_cfg, "head_dim", None) or hidden // heads),
                      rms_eps=float(target_cfg.rms_norm_eps), rope_theta=theta,
                      max_positions=int(target_cfg.max_position_embeddings),
                      target_vocab=int(target_cfg.vocab_size), draft_vocab=draft_vocab)


def hf_config(cfg: HeadConfig, target_name: str) -> dict[str, Any]:
    """The head as a one-layer Llama config the engine's loader reads, plus what it is."""
    return {
        "architectures": ["NightjarFeatureDrafter"], "model_type": "llama", "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate, "num_hidden_layers": 1, "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_eps,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "max_position_embeddings": cfg.max_positions, "vocab_size": cfg.target_vocab,
        "tie_word_embeddings": False, "hidden_act": "silu", "dtype": "bfloat16",
        "nightjar_feature_drafter": {
            "target": target_name, "draft_vocab_size": cfg.draft_vocab,
            "input": "fc([target post-norm last-layer feature at t; target embedding of token t+1])",
            "output": "RMSNorm(layer) -> target's tied LM head rows vocab_ids",
        },
    }


def _weight(head: EagleHead, attr: str) -> torch.Tensor:
    mod = getattr(head, attr)
    return mod if isinstance(mod, torch.nn.Parameter) else cast(torch.Tensor, mod.weight)


def head_state(head: EagleHead) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {"fc.weight": head.fc.weight, "model.norm.weight": head.norm,
                                      "vocab_ids": head.vocab_ids}
    for attr, name in _LAYER.items():
        state["model.layers.0." + name] = _weight(head, attr)
    return {k: (v.detach().long() if k == "vocab_ids" else v.detach().to(torch.bfloat16)).contiguous()
            for k, v in state.items()}


def save_head(head: EagleHead, out: Path, target_name: str, meta: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(head.cfg, target_name), indent=2) + "\n")
    save_file(head_state(head), str(out / "model.safetensors"))
    (out / META).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def load_head(directory: Path, embed: torch.Tensor, lm_head: torch.Tensor | None = None) -> EagleHead:
    """A saved head back as a (float32) ``EagleHead`` over the target's ``embed``."""
    cfg_json = json.loads((directory / "config.json").read_text())
    state = load_file(str(directory / "model.safetensors"))
    rope = cfg_json["rope_parameters"]
    cfg = HeadConfig(hidden=cfg_json["hidden_size"], intermediate=cfg_json["intermediate_size"],
                     heads=cfg_json["num_attention_heads"], kv_heads=cfg_json["num_key_value_heads"],
                     head_dim=cfg_json["head_dim"], rms_eps=cfg_json["rms_norm_eps"],
                     rope_theta=rope["rope_theta"], max_positions=cfg_json["max_position_embeddings"],
                     target_vocab=cfg_json["vocab_size"],
                     draft_vocab=cfg_json["nightjar_feature_drafter"]["draft_vocab_size"])
    head = EagleHead(cfg, embed, state["vocab_ids"], lm_head)
    with torch.no_grad():
        head.fc.weight.copy_(state["fc.weight"].float())
        head.norm.copy_(state["model.norm.weight"].float())
        for attr, name in _LAYER.items():
            _weight(head, attr).copy_(state["model.layers.0." + name].float())
    return head.eval()


def count_params(head: EagleHead) -> int:
    return sum(p.numel() for p in head.parameters())


def _sets(sets: dict[str, list[FeatureSeq]], tags: tuple[str, ...]) -> list[FeatureSeq]:
    return [s for t in tags if t in sets for s in sets[t]]


def run_train_eagle(opts: EagleOptions, log: Log = print) -> dict[str, dict[str, Any]]:
    """Generate (or reuse) the target's data, train, save and measure every head."""
    t_start = time.perf_counter()
    torch.set_num_threads(opts.threads)
    if opts.target_dir.name == "smollm2-135m-instruct":
        export_smollm2(opts.target_dir, log)
    target = load_model(opts.target_dir).eval()
    tok = load_tokenizer(opts.target_dir)
    for p in target.parameters():
        p.requires_grad_(False)
    embed = cast(torch.Tensor, target.get_input_embeddings().weight).detach()
    out_layer = cast(torch.Tensor, target.get_output_embeddings().weight).detach()
    unknown = set(opts.heads) - {r.name for r in HEADS}
    if unknown:
        raise DataError(f"unknown heads {sorted(unknown)}; known: {[r.name for r in HEADS]}")
    recipes = [r for r in HEADS if not opts.heads or r.name in opts.heads]
    needed = frozenset(t for r in recipes for t in (*r.train_sets, *r.other_sets)) | {
        f"{d}-eval" for d in EVAL_DOMAINS}
    log(f"target data: {opts.spec}")
    sets, gen_seconds = target_sets(target, opts.target_dir, tok, opts.data, opts.spec, log, opts.cache_dir,
                                    opts.stdlib_root, needed)
    cached = {t: sum(len(s.tokens) - s.prompt_len for s in v) for t, v in sets.items()}
    log(f"target continuations (new tokens per set): {cached}; generating them took {gen_seconds:.0f}s")
    cfg = head_config(target.config, opts.draft_vocab)
    results: dict[str, dict[str, Any]] = {}
    for i, recipe in enumerate(HEADS):
        if recipe not in recipes:
            continue
        main = _sets(sets, recipe.train_sets)
        vocab = select_vocab(main, cfg.draft_vocab, cfg.target_vocab)
        torch.manual_seed(opts.seed + i)
        head = EagleHead(cfg, embed, vocab, out_layer)
        log(f"{recipe.name}: {len(main)} continuations, vocabulary {len(vocab)}, "
            f"{count_params(head) / 1e6:.2f}M params")
        run = train_head(head, main, _sets(sets, recipe.other_sets), recipe, opts.seed + i, opts.steps)
        head.eval()
        evals = {d: measure(head, sets[f"{d}-eval"]) for d in EVAL_DOMAINS}
        cover = {d: round(coverage(sets[f"{d}-eval"], vocab), 4) for d in EVAL_DOMAINS}
        meta = _meta(recipe, head, run, opts, evals, cover, gen_seconds, cached)
        meta["ngram_eval"] = {d: ngram_measure(sets[f"{d}-eval"]) for d in EVAL_DOMAINS}
        out = save_head(head, opts.out / recipe.name, opts.target_dir.name, meta)
        meta["file_bytes"] = (out / "model.safetensors").stat().st_size
        (out / META).write_text(json.dumps(meta, indent=2) + "\n")
        log(f"{recipe.name}: trained in {run.seconds:.0f}s, loss {run.first_loss:.3f} → {run.last_loss:.3f}; "
            + "; ".join(f"{d}: E@4 {e[4]['E']} α {e[4]['alpha']}" for d, e in evals.items()))
        results[recipe.name] = meta
    if splice_eagle(opts.out, opts.out.resolve().parent / "MODELS.md"):
        log(f"MODELS.md: the feature heads' section rewritten from {opts.out}")
    log(f"train-eagle done in {time.perf_counter() - t_start:.0f}s")
    return results


def _meta(recipe: HeadRecipe, head: EagleHead, run: TrainResult, opts: EagleOptions,
          evals: dict[str, Any], cover: dict[str, float], gen_seconds: float,
          cached: dict[str, int]) -> dict[str, Any]:
    return {
        "name": recipe.name, "role": "feature-drafter", "target": opts.target_dir.name,
        "architecture": (f"fc 2×{head.cfg.hidden}→{head.cfg.hidden} over [feature; embedding], one Llama "
                         f"decoder layer ({head.cfg.heads} heads / {head.cfg.kv_heads} KV heads, MLP "
                         f"{head.cfg.intermediate}), RMSNorm, the target's tied head over "
                         f"{head.cfg.draft_vocab} frequency-ranked tokens"),
        "params": count_params(head), "recipe": {k: v for k, v in vars(recipe).items()},
        "seed": opts.seed, "steps": run.steps, "train_seconds": round(run.seconds, 1),
        "loss_positions": run.positions, "first_loss": round(run.first_loss, 4),
        "last_loss": round(run.last_loss, 4), "generation_seconds": round(gen_seconds, 1),
        "target_new_tokens": cached, "vocab_coverage": cover, "eval": evals,
        "command": (f"nightjar models train-eagle --out {opts.out} --seed {opts.seed} --data {opts.data} "
                    f"--threads {opts.threads}"),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "machine": platform.machine()},
    }
