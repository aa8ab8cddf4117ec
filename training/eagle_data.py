"""The target's own data for feature drafters: greedy continuations with their last-layer features.

One batched pass per prompt group generates the target's greedy continuation and keeps, at
every position, the target's post-norm last-layer hidden state (the feature its LM head reads),
for the prompt too (the prefill computes it anyway). The result is cached on disk under
``CACHE_DIR`` (keyed by the prompts, the length and the target), so every head, every rerun and
the evaluation share one generation.

Prompts: chat — Alpaca instructions (records before ``ALPACA_TRAIN``) and ShareGPT first turns
(rows before ``SHAREGPT_TRAIN``) in the target's chat template; code — prefixes of stdlib Python
source (the training files of ``code_domain``). Held out for evaluation: the later Alpaca and
ShareGPT rows and the held-out stdlib files. Spec-Bench is never read.
"""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from training.corpus import code_domain
from training.generate import left_padded
from training.smol_data import (
    ALPACA_TRAIN,
    _load_json,
    alpaca_records,
    alpaca_user_text,
    chat_prompt_ids,
    code_prompt_ids,
    code_stream,
)

Log = Callable[[str], None]
CACHE_DIR = Path(tempfile.gettempdir()) / "nightjar-eagle-cache"
SHAREGPT = Path("workloads/sharegpt_v3_filtered_1000.json")
SHAREGPT_TRAIN = 900  # rows before this index train; the rest are held out
CODE_PROMPT_TOKENS = 96
MAX_CHAT_PROMPT = 160


@dataclass
class FeatureSeq:
    """A prompt and the target's greedy continuation, with the target's features.

    ``features[p]`` is the post-norm last-layer hidden state at position ``p`` (which the LM
    head turns into the distribution of ``tokens[p + 1]``), for ``p < len(tokens) - 1``.
    """

    tokens: list[int]
    prompt_len: int
    features: torch.Tensor  # [len(tokens) - 1, H] float16


def sharegpt_rows(data_dir: Path) -> list[str]:
    rows = _load_json(data_dir, SHAREGPT)
    return [r["conversations"][0]["value"] for r in rows if r.get("conversations")]


def chat_prompts(tok: PreTrainedTokenizerBase, data_dir: Path, count: int, seed: int,
                 held_out: bool = False) -> dict[str, list[list[int]]]:
    """``count`` Alpaca and ``count`` ShareGPT prompts (template applied), train or held-out rows."""
    records = alpaca_records(data_dir)
    records = records[ALPACA_TRAIN:] if held_out else records[:ALPACA_TRAIN]
    share = sharegpt_rows(data_dir)
    share = share[SHAREGPT_TRAIN:] if held_out else share[:SHAREGPT_TRAIN]
    rng = random.Random(seed)
    records, share = list(records), list(share)
    if not held_out:
        rng.shuffle(records)
        rng.shuffle(share)
    return {"chat": chat_prompt_ids(tok, [alpaca_user_text(r) for r in records], count, MAX_CHAT_PROMPT),
            "sharegpt": chat_prompt_ids(tok, share, count, MAX_CHAT_PROMPT)}


def code_prompts(tok: PreTrainedTokenizerBase, count: int, seed: int, held_out: bool = False,
                 stdlib_root: str | None = None) -> list[list[int]]:
    domain = code_domain(stdlib_root)
    stream = code_stream(tok, domain.val if held_out else domain.train)
    return code_prompt_ids(stream, count, CODE_PROMPT_TOKENS, seed)


@torch.no_grad()
def generate_features(model: PreTrainedModel, prompts: list[list[int]], new_tokens: int,
                      eos_id: int | None, pad_id: int, batch_size: int = 16,
                      desc: str = "generate") -> list[FeatureSeq]:
    """Greedy continuations (stopping after ``eos_id``) of left-padded, length-sorted batches,
    with the target's post-norm features at every position but the last."""
    body, head = model.model, model.get_output_embeddings()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: dict[int, FeatureSeq] = {}
    bar = tqdm(total=len(prompts) * new_tokens, desc=desc, unit="tok", mininterval=1.0)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        ids, mask, pos = left_padded([prompts[i] for i in rows], pad_id)
        width = ids.shape[1]
        res = body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        feats = [res.last_hidden_state.half()]
        nxt = head(res.last_hidden_state[:, -1]).argmax(-1)
        emitted = [nxt]
        done = torch.zeros(len(rows), dtype=torch.bool)
        for _ in range(new_tokens - 1):
            if eos_id is not None:
                done |= nxt == eos_id
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype)], dim=1)
            pos = pos[:, -1:] + 1
            res = body(input_ids=nxt.unsqueeze(1), attention_mask=mask, position_ids=pos, cache=res.cache,
                       use_cache=True)
            feats.append(res.last_hidden_state.half())
            nxt = head(res.last_hidden_state[:, -1]).argmax(-1)
            emitted.append(nxt)
            bar.update(len(rows))
        bar.update(len(rows) * (new_tokens - len(emitted) + 1))
        gen = torch.stack(emitted, dim=1).tolist()
        allf = torch.cat(feats, dim=1)  # [B, width + steps - 1, H]
        for r, i in enumerate(rows):
            n, cont = len(prompts[i]), gen[r]
            if eos_id is not None and eos_id in cont:
                cont = cont[:cont.index(eos_id) + 1]
            tokens = prompts[i] + cont
            f = allf[r, width - n: width - n + len(tokens) - 1].clone()
            out[i] = FeatureSeq(tokens, n, f)
    bar.close()
    return [out[i] for i in range(len(prompts))]


def cached_features(model: PreTrainedModel, model_dir: Path, prompts: list[list[int]], new_tokens: int,
                    eos_id: int | None, pad_id: int, tag: str, log: Log,
                    cache_dir: Path = CACHE_DIR, batch_size: int = 32) -> tuple[list[FeatureSeq], float]:
    """``generate_features`` through the on-disk cache; returns the sequences and the seconds
    their generation took (when it ran, or when the cached run made them)."""
    weights = model_dir / "model.safetensors"
    key = json.dumps([tag, prompts, new_tokens, eos_id, (model_dir / "config.json").read_text(),
                      weights.stat().st_size if weights.is_file() else 0])
    path = cache_dir / f"{tag}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        saved = torch.load(path)
        log(f"  {tag}: {len(saved['rows'])} cached continuations with features from {path} "
            f"(made in {saved['seconds']:.0f}s)")
        return [FeatureSeq(**r) for r in saved["rows"]], float(saved["seconds"])
    t0 = time.perf_counter()
    seqs = generate_features(model, prompts, new_tokens, eos_id, pad_id, batch_size, desc=tag)
    seconds = time.perf_counter() - t0
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"rows": [vars(s) for s in seqs], "seconds": seconds}, path)
    new = sum(len(s.tokens) - s.prompt_len for s in seqs)
    log(f"  {tag}: {len(seqs)} continuations ({new} new tokens) in {seconds:.0f}s, cached in {path}")
    return seqs, seconds


@dataclass(frozen=True)
class DataSpec:
    """How much of the target's own text to make: prompts per source and tokens per prompt."""

    chat_prompts: int = 192  # per chat source (Alpaca and ShareGPT each)
    code_prompts: int = 256
    more_chat: int = 576  # a second set of Alpaca prompts (the next ones), cached apart
    more_sharegpt: int = 288  # a second set of ShareGPT prompts
    more_code: int = 384  # a second set of code prefixes (another seed)
    new_tokens: int = 128
    eval_prompts: int = 32  # held-out prompts per evaluation domain
    eval_new_tokens: int = 96
    seed: int = 0


def prompt_sets(tok: PreTrainedTokenizerBase, data_dir: Path, spec: DataSpec,
                stdlib_root: str | None = None) -> dict[str, tuple[list[list[int]], int]]:
    """tag → (prompts, new tokens) for every training and evaluation set."""
    n = spec.chat_prompts
    train = chat_prompts(tok, data_dir, n + max(spec.more_chat, spec.more_sharegpt), spec.seed)
    held = chat_prompts(tok, data_dir, spec.eval_prompts, spec.seed, held_out=True)
    sets = {
        "chat-train": (train["chat"][:n], spec.new_tokens),
        "sharegpt-train": (train["sharegpt"][:n], spec.new_tokens),
        "code-train": (code_prompts(tok, spec.code_prompts, spec.seed, stdlib_root=stdlib_root),
                       spec.new_tokens),
        "chat-eval": (held["chat"], spec.eval_new_tokens),
        "sharegpt-eval": (held["sharegpt"], spec.eval_new_tokens),
        "code-eval": (code_prompts(tok, spec.eval_prompts, spec.seed + 1, held_out=True,
                                   stdlib_root=stdlib_root), spec.eval_new_tokens),
    }
    if spec.more_chat:
        sets["chat-train-2"] = (train["chat"][n:n + spec.more_chat], spec.new_tokens)
    if spec.more_sharegpt:
        sets["sharegpt-train-2"] = (train["sharegpt"][n:n + spec.more_sharegpt], spec.new_tokens)
    if spec.more_code:
        sets["code-train-2"] = (code_prompts(tok, spec.more_code, spec.seed + 100, stdlib_root=stdlib_root),
                                spec.new_tokens)
    return sets


def target_sets(model: PreTrainedModel, model_dir: Path, tok: PreTrainedTokenizerBase, data_dir: Path,
                spec: DataSpec, log: Log, cache_dir: Path = CACHE_DIR, stdlib_root: str | None = None,
                only: frozenset[str] | None = None) -> tuple[dict[str, list[FeatureSeq]], float]:
    """Every set of ``prompt_sets``, generated once (cached); returns them and the seconds their
    generation took (cached runs included)."""
    eos = model.config.eos_token_id
    eos_id = None if eos is None else int(eos if isinstance(eos, int) else eos[0])
    pad = model.config.pad_token_id
    pad_id = eos_id or 0 if pad is None else int(pad)
    out, seconds = {}, 0.0
    for tag, (prompts, new) in prompt_sets(tok, data_dir, spec, stdlib_root).items():
        if only is not None and tag not in only:
            continue
        out[tag], s = cached_features(model, model_dir, prompts, new, eos_id, pad_id, tag, log, cache_dir)
        seconds += s
    return out, seconds
