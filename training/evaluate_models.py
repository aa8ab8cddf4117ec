"""`eval`: measures every bundled nj-model on held-out text and rewrites MODELS.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.batches import encode_domains
from training.checkpoint import dir_bytes, load_model, load_tokenizer, read_meta, write_meta
from training.corpus import DOMAINS, DataError, load_domains
from training.distill import PROMPT_LEN
from training.evaluate import (
    EvalSet,
    continuation_agreement,
    forced_agreement,
    greedy_tokens,
    make_eval_set,
    val_loss,
)
from training.generate import greedy_continue
from training.report import write_report
from training.specs import TARGET
from training.tokenizer import EOT

EVAL_SEED = 1234
EVAL_WINDOWS = 48  # per domain, of 256 tokens
EVAL_PROMPTS = 32  # per domain
EVAL_NEW_TOKENS = 96
SEQ_LEN = 256
SAMPLE_PROMPTS = ("Once upon a time", "def ")
SAMPLE_TOKENS = 64


def _r(x: float) -> float:
    return round(x, 4)


def samples(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> dict[str, str]:
    """Greedy continuations of the sanity-check prompts, cut at the first end of document."""
    out = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        text = str(tokenizer.decode(greedy_continue(model, ids, SAMPLE_TOKENS)[0, 1:].tolist()))
        out[prompt] = text.split(EOT)[0]
    return out


def evaluate_models(models_dir: Path, data_dir: Path, log: Callable[[str], None] = print,
                    report: Path | None = None, target_name: str = TARGET.name, threads: int = 2) -> Path:
    """Fills each model's metadata with its measurements; returns the MODELS.md path written."""
    torch.set_num_threads(threads)
    target_dir = models_dir / target_name
    if not (target_dir / "config.json").is_file():
        raise DataError(f"no trained target in {target_dir} (run `nightjar models train` first)")
    start = time.perf_counter()
    tokenizer = load_tokenizer(target_dir)
    val = encode_domains(tokenizer, load_domains(data_dir), "val")
    sets: dict[str, EvalSet] = {
        d: make_eval_set(val[d], SEQ_LEN, EVAL_WINDOWS, EVAL_PROMPTS, EVAL_SEED + i)
        for i, d in enumerate(DOMAINS)
    }
    target = load_model(target_dir)
    conts = {d: greedy_continue(target, s.prompts, EVAL_NEW_TOKENS) for d, s in sets.items()}
    target_tokens = {d: greedy_tokens(target, s.windows) for d, s in sets.items()}
    drafters = [d for d in sorted(models_dir.iterdir()) if read_meta(d).get("teacher") == target_name]
    dirs = [target_dir, *drafters]
    for model_dir in dirs:
        model = target if model_dir == target_dir else load_model(model_dir)
        results: dict[str, Any] = {"val_loss": {}}
        for d, s in sets.items():
            results["val_loss"][d] = _r(val_loss(model, s.windows))
        if model is not target:
            results.update(agreement_forced={}, agreement_continuation={}, accept_len_g4={})
            for d, s in sets.items():
                agree, accept = continuation_agreement(model, conts[d], PROMPT_LEN)
                results["agreement_forced"][d] = _r(forced_agreement(target_tokens[d], model, s.windows))
                results["agreement_continuation"][d] = _r(agree)
                results["accept_len_g4"][d] = _r(accept)
        meta = read_meta(model_dir)
        if model is target:
            meta["samples"] = samples(target, tokenizer)
        meta["eval"] = results
        meta["file_bytes"] = dir_bytes(model_dir)
        write_meta(model_dir, meta)
        log(f"{model_dir.name}: " + ", ".join(f"{k}={v}" for k, v in results.items()))
    log(f"evaluated in {time.perf_counter() - start:.0f}s")
    path = write_report(models_dir, report)
    log(f"wrote {path}")
    return path
