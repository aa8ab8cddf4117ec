"""The MODELS.md section of the feature heads (from their ``nightjar_meta.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.checkpoint import read_meta

GAMMAS = ("1", "2", "4", "8")


def _heads(models_dir: Path) -> list[dict[str, Any]]:
    found = [read_meta(d) for d in sorted(models_dir.glob("smol-eagle-*")) if d.is_dir()]
    return [m for m in found if m.get("role") == "feature-drafter"]


def _row(name: str, domain: str, ev: dict[str, Any]) -> str:
    cells = [f"{ev[g]['E']:.2f} / {ev[g]['alpha']:.2f}" for g in GAMMAS]
    return f"| `{name}` | {domain} | " + " | ".join(cells) + " |"


def render_eagle(models_dir: Path) -> list[str]:
    heads = _heads(models_dir)
    lines = ["", "## SmolLM2's feature drafters (EAGLE-style heads)", ""]
    if not heads:
        return [*lines, "Not trained yet: run `nightjar models train-eagle`."]
    first = heads[0]
    lines += [
        "Each head reads SmolLM2's own post-norm last-layer hidden state at position t and the "
        "embedding of token t+1 (`fc` over both), runs one Llama decoder layer and an RMSNorm, and "
        "proposes through SmolLM2's tied output layer restricted to the "
        f"{first['architecture'].split('over ')[-1]} SmolLM2 emits most in the head's training "
        "continuations: the rows are the target's own, so the head stores only their ids (the full "
        "49,152-row product would cost a drafted position ~7 ms here, most of a draft; the price is "
        "the coverage below, a ceiling on acceptance). "
        "Trained on SmolLM2's own greedy continuations (self-distillation) with their features, "
        "generated once and cached; loss: cross-entropy to SmolLM2's next-token distribution "
        "renormalised over the head's vocabulary plus a small smooth-L1 feature regression, on the "
        "real pass and one chained pass fed the head's own feature (EAGLE-3's training-time test). "
        "Committed (bf16, the embedding referenced); `nightjar models train-eagle` rebuilds them.",
        "",
        "| head | architecture | params | file | training data | train time | steps | seed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in heads:
        sets = ", ".join(m["recipe"]["train_sets"])
        lines.append(
            f"| `{m['name']}` | {m['architecture']} | {m['params'] / 1e6:.2f}M | "
            f"{m.get('file_bytes', 0) / 1e6:.1f} MB | {sets} ({m['loss_positions']} loss positions "
            f"seen) | {m['train_seconds'] / 60:.1f} min | {m['steps']} | {m['seed']} |"
        )
    widest = max(heads, key=lambda m: len(m.get("target_new_tokens", {})))
    gen = widest.get("generation_seconds", 0)
    toks = widest.get("target_new_tokens", {})
    train = sum(m["train_seconds"] for m in heads)
    lines += [
        "",
        f"SmolLM2's continuations (new tokens per set: {toks}) took {gen / 60:.1f} min to generate "
        f"with their features (batched, {widest['environment']['threads']} torch threads, on this "
        f"2-core machine); training both heads {train / 60:.1f} min; the whole command about "
        f"{(gen + train) / 60 + 3:.0f} min (evaluation included).",
        "",
        "Tokens per verification E and per-position acceptance α (E = (1 − α^(γ+1))/(1 − α)), "
        "\"E / α\" per γ, on SmolLM2's own greedy continuations of held-out prompts (what a verifier "
        "sees): a chain of γ drafts after every generated position, the real past teacher-forced, "
        "exactly as the engine drafts after a verification. For comparison, the same measure for "
        "the engine's n-gram drafter on the same continuations; the model drafters above reach "
        "E = 1.04–1.21 at γ = 4 (their accepted/step plus one).",
        "",
        "| drafter | domain | γ=1 | γ=2 | γ=4 | γ=8 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in heads:
        for domain, ev in m["eval"].items():
            lines.append(_row(m["name"], domain, ev))
    for domain, ev in first.get("ngram_eval", {}).items():
        lines.append(_row("ngram", domain, ev))
    lines += [
        "",
        "Honestly: the issue's target (α ≥ 0.6 at γ = 4 in domain) is not reached. In domain the "
        "heads agree with SmolLM2's next token on ~0.36 (chat) and ~0.48 (code) of held-out "
        "positions, and α hardly falls with γ, so the chained training-time pass works but the "
        "first guess is the weak one. What limits them, measured: data. Three times the text "
        "(116k chat and 82k code tokens of SmolLM2's own continuations, against 38k and 24k "
        "before) and four times the steps (800) lifted the first guess from 0.29 to 0.36 (chat) "
        "and from 0.38 to 0.48 (code); at that rate 0.6 needs one or two orders of magnitude "
        "more of SmolLM2's text than this CPU generates in the command's 90 minutes (SmolLM2 "
        "writes ~130 tokens/s here, batched). The 8,192-token vocabulary covers 93% of held-out "
        "chat tokens and 97% of code (a ceiling well above where the heads are). On code the "
        "n-gram drafter is far ahead (SmolLM2 repeats itself in code: E = 3.0 at γ = 4); on chat "
        "it is level at γ = 1 and ahead from γ = 2 on, where its hits come in runs.",
    ]
    for m in heads:
        cover = ", ".join(f"{d} {100 * c:.1f}%" for d, c in m["vocab_coverage"].items())
        lines += ["", f"- `{m['name']}`: vocabulary coverage of the held-out continuations: {cover}; "
                      f"train loss {m['first_loss']:.3f} → {m['last_loss']:.3f}.",
                  f"  Reproduce: `{m['command']}`"]
    return lines


def splice_eagle(models_dir: Path, md: Path) -> bool:
    """Replace (or append) this section in an existing MODELS.md, leaving the rest as it is
    (the other sections describe models this checkout may not have built)."""
    if not md.is_file():
        return False
    text = md.read_text(encoding="utf-8")
    head = "\n## SmolLM2's feature drafters"
    keep = (text[: text.index(head)] if head in text else text).rstrip("\n") + "\n\n"
    md.write_text(keep + "\n".join(render_eagle(models_dir)[1:]) + "\n", encoding="utf-8")
    return True
