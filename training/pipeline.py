"""`train`: tokenizer, then the target, then each drafter distilled from the saved target."""

from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from training.batches import WindowSampler, encode_domains
from training.checkpoint import count_params, dir_bytes, load_model, read_meta, save_model, write_meta
from training.corpus import DOMAINS, load_domains
from training.distill import build_distill_set, distill
from training.evaluate_models import evaluate_models
from training.specs import DRAFTERS, TARGET, Recipe
from training.tokenizer import eot_id, train_tokenizer
from training.trainer import Batch, LoopConfig, TrainLog, lm_loss, train_loop

TARGET_SHARE = 2 / 3  # of --budget-s; the rest is split evenly between the drafters

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainOptions:
    out: Path
    seed: int
    data: Path
    budget_s: float | None = None
    target_steps: int | None = None
    draft_steps: int | None = None
    threads: int = 2
    target: Recipe = TARGET
    drafters: tuple[Recipe, ...] = DRAFTERS


def _command(opts: TrainOptions, target_steps: int | None, draft_steps: int | None) -> str:
    """The command that repeats this run step for step (a budgeted run pins its measured steps)."""
    cmd = (f"nightjar models train --out {opts.out} --seed {opts.seed} --data {opts.data} "
           f"--threads {opts.threads}")
    if target_steps is not None:
        cmd += f" --target-steps {target_steps}"
    if draft_steps is not None:
        cmd += f" --draft-steps {draft_steps}"
    return cmd


def _environment() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "machine": platform.machine()}


def _loop_config(recipe: Recipe, steps: int | None, budget_s: float | None) -> LoopConfig:
    if steps is None and budget_s is None:
        steps = recipe.steps
    return LoopConfig(steps=steps, lr=recipe.lr, warmup=recipe.warmup, budget_s=budget_s)


def _meta(recipe: Recipe, model: torch.nn.Module, vocab: int, run: TrainLog, opts: TrainOptions,
          role: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": recipe.name, "role": role, "recipe": recipe.as_dict(), "vocab_size": vocab,
        "params": count_params(model), "matmul_params": recipe.arch.matmul_params(vocab),
        "seed": opts.seed, "steps": run.steps, "tokens_seen": run.tokens,
        "train_seconds": round(run.seconds, 1), "first_train_loss": round(run.first_loss, 4),
        "final_train_loss": round(run.last_loss, 4), "environment": _environment(), **extra,
    }


def train_target(tokenizer: PreTrainedTokenizerBase, streams: dict[str, torch.Tensor], recipe: Recipe,
                 cfg: LoopConfig, seed: int, log: Log) -> tuple[LlamaForCausalLM, TrainLog]:
    """Trains a Llama model from scratch with next-token cross-entropy on ``recipe.domains``."""
    torch.manual_seed(seed)
    eot = eot_id(tokenizer)
    model = LlamaForCausalLM(recipe.arch.llama_config(len(tokenizer), eot)).float()
    sampler = WindowSampler(torch.cat([streams[d] for d in recipe.domains]), recipe.seq_len, seed)

    def next_batch() -> Batch:
        w = sampler.sample(recipe.batch_size)
        return {"input_ids": w[:, :-1], "labels": w[:, 1:]}

    return model, train_loop(model, next_batch, lm_loss, cfg, log)


def train_drafter(teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                  streams: dict[str, torch.Tensor], recipe: Recipe, cfg: LoopConfig, seed: int,
                  log: Log) -> tuple[LlamaForCausalLM, TrainLog, dict[str, Any]]:
    """Distils a small Llama from ``teacher`` on ``recipe.domains``."""
    stream = torch.cat([streams[d] for d in recipe.domains])
    data = build_distill_set(teacher, stream, recipe.seq_len, recipe.topk, recipe.continuations, seed,
                             recipe.max_windows, log)
    torch.manual_seed(seed)
    eot = eot_id(tokenizer)
    model = LlamaForCausalLM(recipe.arch.llama_config(len(tokenizer), eot)).float()
    run = distill(model, data, recipe.batch_size, cfg, seed, log)
    info = {"teacher_seconds": round(data.teacher_seconds, 1), "distill_windows": int(data.windows.shape[0]),
            "teacher_continuations": data.generated_rows}
    return model, run, info


def run_train(opts: TrainOptions, log: Log = print) -> None:
    """The whole `train` command; ends by evaluating everything and rewriting MODELS.md."""
    torch.set_num_threads(opts.threads)
    domains = load_domains(opts.data)
    start = time.perf_counter()
    tokenizer = train_tokenizer(doc for name in DOMAINS for doc in domains[name].train)
    tok_seconds = time.perf_counter() - start
    streams = encode_domains(tokenizer, domains, "train")
    log(f"tokenizer: {len(tokenizer)} tokens in {tok_seconds:.0f}s; train tokens "
        + ", ".join(f"{k}={v.numel()}" for k, v in streams.items()))

    share = None if opts.budget_s is None else opts.budget_s * (1 - TARGET_SHARE) / len(opts.drafters)
    target_budget = None if opts.budget_s is None else opts.budget_s * TARGET_SHARE
    log(f"{opts.target.name}: training")
    target_cfg = _loop_config(opts.target, opts.target_steps, target_budget)
    model, run = train_target(tokenizer, streams, opts.target, target_cfg, opts.seed, log)
    draft_steps = opts.draft_steps
    extra = {"tokenizer_seconds": round(tok_seconds, 1),
             "train_tokens_per_domain": {k: v.numel() for k, v in streams.items()}}
    target_dir = opts.out / opts.target.name
    meta = _meta(opts.target, model, len(tokenizer), run, opts, "target", **extra)
    save_model(model, tokenizer, target_dir, meta)
    # The drafters learn from the saved (bf16-rounded) weights: the model the engine serves.
    teacher = load_model(target_dir)
    drafter_runs = []
    for i, recipe in enumerate(opts.drafters):
        log(f"{recipe.name}: distilling from {opts.target.name}")
        cfg = _loop_config(recipe, draft_steps, None if draft_steps is not None else share)
        drafter, drun, info = train_drafter(teacher, tokenizer, streams, recipe, cfg, opts.seed + 1 + i, log)
        if draft_steps is None and share is not None:
            draft_steps = drun.steps  # a budgeted run sizes the first drafter; the others match it
        meta = _meta(recipe, drafter, len(tokenizer), drun, opts, "drafter", teacher=opts.target.name, **info)
        save_model(drafter, tokenizer, opts.out / recipe.name, meta)
        drafter_runs.append(recipe.name)
    pinned = opts.budget_s is not None
    command = _command(opts, run.steps if pinned or opts.target_steps else None, draft_steps)
    for name in [opts.target.name, *drafter_runs]:
        _set_command(opts.out / name, command)
        log(f"{name}: {dir_bytes(opts.out / name) / 1e6:.2f} MB")
    log(f"reproduce with: {command}  (python {sys.version.split()[0]})")
    evaluate_models(opts.out, opts.data, log, target_name=opts.target.name, threads=opts.threads)


def _set_command(model_dir: Path, command: str) -> None:
    meta = read_meta(model_dir)
    meta["command"] = command
    write_meta(model_dir, meta)
