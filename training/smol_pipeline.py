"""`train-smol-drafters` and `eval-smol`: data, teacher labels, training and measurement."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from training.batches import WindowSampler
from training.checkpoint import dir_bytes, load_model, read_meta, save_model, write_meta
from training.corpus import DataError, code_domain
from training.evaluate import mean_accepted, val_loss
from training.generate import LabelledSeq
from training.report import write_report
from training.smol_data import (
    ALPACA_TRAIN,
    alpaca_records,
    alpaca_user_text,
    chat_prompt_ids,
    code_prompt_ids,
    code_stream,
    conversation_stream,
    sharegpt_prompts,
)
from training.smol_drafters import (
    CODE_PROMPT_TOKENS,
    NEW_TOKENS,
    SMOL_DRAFTERS,
    TEACHER_NAME,
    Teacher,
    build_set,
    cached_labels,
    load_teacher,
    smol_meta,
    train_smol_drafter,
)
from training.smollm2 import export_smollm2
from training.trainer import LoopConfig

Log = Callable[[str], None]
EVAL_SEED = 4321
EVAL_PROMPTS = 16
EVAL_NEW_TOKENS = 64
EVAL_WINDOWS = 16
SHAREGPT_MAX_PROMPT = 192


@dataclass(frozen=True)
class SmolOptions:
    out: Path
    data: Path
    teacher_dir: Path
    seed: int = 0
    budget_s: float | None = None
    steps: int | None = None
    threads: int = 2


def _command(opts: SmolOptions, steps: int | None) -> str:
    cmd = (f"nightjar models train-smol-drafters --out {opts.out} --seed {opts.seed} --data {opts.data} "
           f"--threads {opts.threads}")
    return cmd + (f" --steps {steps}" if steps is not None else "")


def _training_inputs(teacher: Teacher, data: Path, seed: int,
                     counts: dict[str, int]) -> dict[str, tuple[list[list[int]], torch.Tensor]]:
    """Per domain: ``counts[domain]`` prompts for the teacher to answer, and the reference text."""
    tok = teacher.tokenizer
    records = alpaca_records(data)[:ALPACA_TRAIN]
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    chat_prompts = chat_prompt_ids(tok, [alpaca_user_text(r) for r in shuffled], counts["chat"])
    code_text = code_stream(tok, code_domain().train)
    code_prompts = code_prompt_ids(code_text, counts["code"], CODE_PROMPT_TOKENS, seed)
    return {"chat": (chat_prompts, conversation_stream(tok, records)), "code": (code_prompts, code_text)}


def run_smol(opts: SmolOptions, log: Log = print) -> None:
    torch.set_num_threads(opts.threads)
    export_smollm2(opts.teacher_dir, log)
    teacher = load_teacher(opts.teacher_dir)
    counts = {r.domains[0]: r.continuations for r in SMOL_DRAFTERS}
    inputs = _training_inputs(teacher, opts.data, opts.seed, counts)
    budget = None if opts.budget_s is None else opts.budget_s / len(SMOL_DRAFTERS)
    steps = opts.steps
    for i, recipe in enumerate(SMOL_DRAFTERS):
        (domain,) = recipe.domains
        prompts, text = inputs[domain]
        log(f"{recipe.name}: SmolLM2 answers {recipe.continuations} {domain} prompts")
        seqs, seconds = cached_labels(teacher, prompts, NEW_TOKENS, recipe.topk, f"train-{domain}", log)
        data = build_set(seqs, text, recipe, teacher.pad_id, opts.seed + i, seconds)
        run_steps = steps if steps is not None else (None if budget is not None else recipe.steps)
        cfg = LoopConfig(steps=run_steps, lr=recipe.lr, warmup=recipe.warmup, budget_s=budget, log_every=20)
        model, run = train_smol_drafter(teacher, data, recipe, cfg, opts.seed + i, log)
        if steps is None and budget is not None:
            steps = run.steps  # the first drafter's measured count, reused for the second
        meta = smol_meta(recipe, model, teacher, data, run, opts.seed, "")
        save_model(model, teacher.tokenizer, opts.out / recipe.name, meta)
    pinned = steps if (opts.budget_s is not None or opts.steps is not None) else None
    for recipe in SMOL_DRAFTERS:
        meta = read_meta(opts.out / recipe.name)
        meta["command"] = _command(opts, pinned)
        write_meta(opts.out / recipe.name, meta)
    evaluate_smol(opts.out, opts.data, teacher, log)


def _eval_inputs(teacher: Teacher, data: Path) -> dict[str, tuple[list[list[int]], torch.Tensor | None]]:
    tok = teacher.tokenizer
    held_out = alpaca_records(data)[ALPACA_TRAIN:]
    code_val = code_stream(tok, code_domain().val)
    return {
        "chat": (chat_prompt_ids(tok, [alpaca_user_text(r) for r in held_out], EVAL_PROMPTS),
                 conversation_stream(tok, held_out)),
        "sharegpt": (chat_prompt_ids(tok, sharegpt_prompts(data), EVAL_PROMPTS, SHAREGPT_MAX_PROMPT), None),
        "code": (code_prompt_ids(code_val, EVAL_PROMPTS, 2 * CODE_PROMPT_TOKENS, EVAL_SEED), code_val),
    }


@torch.no_grad()
def sequence_agreement(drafter: torch.nn.Module, seqs: list[LabelledSeq],
                       gamma: int = 4) -> tuple[float, float, float]:
    """(teacher-forced agreement on the prompts, agreement on the teacher's answers, accepted/step)."""
    forced: list[bool] = []
    answers: list[list[bool]] = []
    for s in seqs:
        pred = drafter(input_ids=torch.tensor([s.tokens[:-1]])).logits[0].argmax(-1)
        n = s.prompt_len
        forced += (pred[:n - 1] == s.topk_ids[:n - 1, 0]).tolist()
        answers.append((pred[n - 1:] == torch.tensor(s.tokens[n:])).tolist())
    flat = [h for row in answers for h in row]
    return sum(forced) / max(1, len(forced)), sum(flat) / max(1, len(flat)), mean_accepted(answers, gamma)


def evaluate_smol(models_dir: Path, data: Path, teacher: Teacher, log: Log = print) -> Path:
    """Measures every smol-drafter present against SmolLM2 and rewrites MODELS.md."""
    start = time.perf_counter()
    inputs = _eval_inputs(teacher, data)
    labelled = {d: cached_labels(teacher, prompts, EVAL_NEW_TOKENS, 1, f"eval-{d}", log)[0]
                for d, (prompts, _) in inputs.items()}
    found = [d for d in sorted(models_dir.glob("smol-*")) if read_meta(d).get("teacher") == TEACHER_NAME]
    if not found:
        raise DataError(f"no smol drafters in {models_dir} (run `nightjar models train-smol-drafters`)")
    for model_dir in found:
        drafter = load_model(model_dir)
        results: dict[str, dict[str, float]] = {"val_loss": {}, "agreement_forced": {},
                                                "agreement_continuation": {}, "accept_len_g4": {}}
        for domain, (_, text) in inputs.items():
            if text is not None:
                windows = WindowSampler(text, 256, EVAL_SEED).sample(EVAL_WINDOWS)
                results["val_loss"][domain] = round(val_loss(drafter, windows), 4)
            forced, cont, accept = sequence_agreement(drafter, labelled[domain])
            results["agreement_forced"][domain] = round(forced, 4)
            results["agreement_continuation"][domain] = round(cont, 4)
            results["accept_len_g4"][domain] = round(accept, 4)
        meta = read_meta(model_dir)
        meta["eval"] = results
        meta["file_bytes"] = dir_bytes(model_dir)
        write_meta(model_dir, meta)
        log(f"{model_dir.name}: " + ", ".join(f"{k}={v}" for k, v in results.items()))
    log(f"evaluated in {time.perf_counter() - start:.0f}s")
    return write_report(models_dir)


def run_eval_smol(models_dir: Path, data: Path, teacher_dir: Path, threads: int, log: Log = print) -> Path:
    torch.set_num_threads(threads)
    if not (teacher_dir / "config.json").is_file():
        raise DataError(f"no SmolLM2 export in {teacher_dir} (run `nightjar models smollm2`)")
    return evaluate_smol(models_dir, data, load_teacher(teacher_dir), log)
