"""`train-smol-drafters`: tiny drafters for SmolLM2-135M-Instruct, distilled from it.

SmolLM2 is slow here (tens to hundreds of tokens/s on two shared cores), so its time goes where
it matters most: its own greedy answers to chat prompts and continuations of code, each position
kept with its top-k soft labels (cached under /tmp, so a rerun skips the teacher). Reference text
(Alpaca answers, stdlib source) is free and fills the other half of every batch with hard labels.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from training.batches import chunk_windows
from training.checkpoint import count_params, load_model, load_tokenizer
from training.distill import DistillSet, labelled_rows, one_hot_rows
from training.generate import LabelledSeq, generate_labelled
from training.specs import ArchSpec, Recipe
from training.trainer import LoopConfig, TrainLog, distill_loss, train_loop

Log = Callable[[str], None]
TEACHER_NAME = "smollm2-135m-instruct"
CACHE_DIR = Path(tempfile.gettempdir()) / "nightjar-smol-cache"
NEW_TOKENS = 128  # teacher tokens generated per training prompt
CODE_PROMPT_TOKENS = 96
SOFT_SHARE = 0.5  # of each batch drawn from the teacher-labelled rows

# Narrow and shallow: the 49,152-wide tied output layer is most of the cost and of the bytes.
SMOL_ARCH = ArchSpec(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, max_positions=8192,
                     rope_theta=100000.0)
SMOL_DRAFTERS = (
    Recipe(name="smol-draft-chat", arch=SMOL_ARCH, domains=("chat",), steps=400, batch_size=8, lr=1e-2,
           warmup=20, distill=True, topk=32, continuations=96, max_windows=1500),
    Recipe(name="smol-draft-code", arch=SMOL_ARCH, domains=("code",), steps=400, batch_size=8, lr=1e-2,
           warmup=20, distill=True, topk=32, continuations=64, max_windows=1500),
)


@dataclass(frozen=True)
class Teacher:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    directory: Path

    @property
    def eos_id(self) -> int:
        return int(self.model.config.eos_token_id)

    @property
    def pad_id(self) -> int:
        pad = self.model.config.pad_token_id
        return self.eos_id if pad is None else int(pad)


def load_teacher(directory: Path) -> Teacher:
    return Teacher(load_model(directory), load_tokenizer(directory), directory)


def cached_labels(teacher: Teacher, prompts: list[list[int]], new_tokens: int, k: int, tag: str,
                  log: Log) -> tuple[list[LabelledSeq], float]:
    """The teacher's labelled continuations of ``prompts``, from /tmp if an identical run made them.

    Returns the sequences and the seconds spent (0 on a cache hit).
    """
    weights = teacher.directory / "model.safetensors"
    key_src = json.dumps([tag, prompts, new_tokens, k, (teacher.directory / "config.json").read_text(),
                          weights.stat().st_size if weights.is_file() else 0])
    path = CACHE_DIR / f"{tag}-{hashlib.sha256(key_src.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        rows = torch.load(path)
        log(f"  {tag}: {len(rows)} teacher sequences from {path}")
        return [LabelledSeq(**row) for row in rows], 0.0
    start = time.perf_counter()
    seqs = generate_labelled(teacher.model, prompts, new_tokens, k, teacher.eos_id, teacher.pad_id)
    seconds = time.perf_counter() - start
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    torch.save([vars(s) for s in seqs], path)
    tokens = sum(len(s.tokens) for s in seqs)
    log(f"  {tag}: {len(seqs)} teacher sequences ({tokens} tokens) in {seconds:.0f}s, cached in {path}")
    return seqs, seconds


def build_set(teacher_seqs: list[LabelledSeq], text: torch.Tensor, recipe: Recipe, pad_id: int,
              seed: int, teacher_seconds: float) -> DistillSet:
    """Teacher rows (soft labels) plus reference-text windows (hard labels), weighted to SOFT_SHARE."""
    soft_w, soft_ids, soft_p = labelled_rows(teacher_seqs, recipe.seq_len, pad_id)
    windows = chunk_windows(text, recipe.seq_len)
    if recipe.max_windows is not None and windows.shape[0] > recipe.max_windows:
        keep = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(seed))
        windows = windows[keep[:recipe.max_windows].sort().values]
    hard_ids, hard_p = one_hot_rows(windows, recipe.topk)
    n_soft, n_hard = soft_w.shape[0], windows.shape[0]
    weights = torch.cat([torch.full((n_soft,), SOFT_SHARE / n_soft),
                         torch.full((n_hard,), (1 - SOFT_SHARE) / n_hard)])
    return DistillSet(torch.cat([soft_w, windows]), torch.cat([soft_ids, hard_ids]),
                      torch.cat([soft_p, hard_p]), n_soft, teacher_seconds, weights)


def embedding_table(model: PreTrainedModel) -> torch.Tensor:
    table = model.get_input_embeddings()
    assert isinstance(table, torch.nn.Embedding)
    return table.weight


@torch.no_grad()
def project_embeddings(teacher: PreTrainedModel, student: PreTrainedModel) -> None:
    """Starts the student's (tied) embeddings at the teacher's, projected on their top principal axes.

    A random 49,152 × 64 table needs far more steps than we can afford to learn which tokens are
    alike; the projection hands over that structure. Rescaled to the teacher's per-entry RMS.
    """
    big = embedding_table(teacher).float()
    target = embedding_table(student)
    width = target.shape[1]
    _, _, v = torch.linalg.svd(big.T @ big)  # 576 × 576: cheap, and its right vectors are the axes
    small = big @ v[:width].T
    small *= big.pow(2).mean().sqrt() / small.pow(2).mean().sqrt()
    target.copy_(small)


def train_smol_drafter(teacher: Teacher, data: DistillSet, recipe: Recipe, cfg: LoopConfig, seed: int,
                       log: Log) -> tuple[LlamaForCausalLM, TrainLog]:
    torch.manual_seed(seed)
    config = recipe.arch.llama_config(len(teacher.tokenizer), teacher.eos_id,
                                      bos_id=teacher.model.config.bos_token_id, pad_id=teacher.pad_id)
    model = LlamaForCausalLM(config).float()
    project_embeddings(teacher.model, model)
    return model, train_loop(model, data.batches(recipe.batch_size, seed), distill_loss, cfg, log)


def smol_meta(recipe: Recipe, model: torch.nn.Module, teacher: Teacher, data: DistillSet, run: TrainLog,
              seed: int, command: str) -> dict[str, Any]:
    vocab = len(teacher.tokenizer)
    teacher_cost = sum(p.numel() for p in teacher.model.parameters())
    source = "SmolLM2's greedy answers to Alpaca chat prompts" if recipe.domains == ("chat",) else \
        "SmolLM2's greedy continuations of stdlib code prefixes"
    reference = "Alpaca reference answers in SmolLM2's chat template" if recipe.domains == ("chat",) else \
        "stdlib Python source"
    hard = data.windows.shape[0] - data.generated_rows
    note = (f"{data.generated_rows} rows of {source} with its top-{recipe.topk} soft labels (generating and "
            f"labelling them took {data.teacher_seconds:.0f} s; 0 means the /tmp cache was used) and "
            f"{hard} windows of {reference} with hard labels; the teacher rows are {SOFT_SHARE:.0%} "
            f"of every batch of {recipe.batch_size} × {recipe.seq_len} tokens. "
            f"Train loss {run.first_loss:.3f} → {run.last_loss:.3f}.")
    return {
        "name": recipe.name, "role": "drafter", "teacher": TEACHER_NAME, "recipe": recipe.as_dict(),
        "vocab_size": vocab, "params": count_params(model), "matmul_params": recipe.arch.matmul_params(vocab),
        "teacher_matmul_params": teacher_cost, "seed": seed, "steps": run.steps, "tokens_seen": run.tokens,
        "train_seconds": round(run.seconds, 1), "first_train_loss": round(run.first_loss, 4),
        "final_train_loss": round(run.last_loss, 4), "teacher_seconds": round(data.teacher_seconds, 1),
        "distill_windows": int(data.windows.shape[0]), "teacher_continuations": data.generated_rows,
        "data_note": note, "command": command,
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "threads": torch.get_num_threads(), "machine": platform.machine()},
    }

