"""The baseline outside the project: transformers' own ``generate`` on the same model and prompts.

Two ways a user without Nightjar would serve the benchmark's prompts:

- static batching: batches of ``batch_size`` prompts in plan order, left-padded, greedy,
  every request generating exactly its ``max_tokens`` (``min_new_tokens``, the equivalent of
  ``ignore_eos``); a request's latency is its batch's wall time;
- assisted generation (``assistant_model=`` the drafter) at batch 1, beside plain batch-1
  ``generate`` on the same prompts for the speed-up.

Prompts are tokenized by the worker's own ``PromptEncoder`` (chat template included), so
the token ids are exactly those the services see. All prompts are available at once (no
arrival process): these rows are capacity numbers, not latencies under load.

    python -m benchmarks.hf_baseline WORKLOAD --model DIR [--drafter DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.load.results import BaselineRow


@dataclass(frozen=True)
class BaselineSettings:
    model_dir: str
    chat: bool = True
    batch_size: int = 8
    requests: int = 32  # prompts for static batching
    assisted: int = 8  # prompts for assisted generation (0: skip)
    drafter_dir: str | None = None
    device: str | None = None  # default: cuda when available
    dtype: str | None = None  # default: float32 on CPU, bfloat16 on CUDA


def _load(model_dir: str, device: Any, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()


def _encode(model_dir: str, prompts: list[str], chat: bool) -> list[list[int]]:
    from shared.schemas import ChatMessage, JobRequest
    from worker.prompts import PromptEncoder

    enc = PromptEncoder.from_dir(model_dir)
    jobs = [
        JobRequest(job_id=f"hf-{i}", messages=[ChatMessage(role="user", content=p)])
        if chat
        else JobRequest(job_id=f"hf-{i}", prompt=p)
        for i, p in enumerate(prompts)
    ]
    return [enc.encode(j) for j in jobs]


def _generate(model: Any, batch: list[list[int]], new_tokens: int, pad_id: int, **kw: Any) -> float:
    """Greedy-generate exactly ``new_tokens`` for a left-padded batch; returns wall seconds."""
    import torch

    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in batch], device=model.device)
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            **kw,
        )
    sync()
    wall = time.perf_counter() - t
    if out.shape[1] - width != new_tokens:
        raise RuntimeError(f"generate made {out.shape[1] - width} tokens, not {new_tokens}")
    return wall


def _row(name: str, tokens: int, walls: list[float], latencies: list[float], note: str) -> BaselineRow:
    wall = sum(walls)
    lat = np.asarray(latencies, dtype=float)
    return BaselineRow(name, len(latencies), tokens, wall, tokens / wall if wall > 0 else 0.0,
                       float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), note)  # fmt: skip


def run_baseline(s: BaselineSettings, prompts: list[str], max_tokens: list[int]) -> list[BaselineRow]:
    """Rows for static batching and (with a drafter) assisted vs plain batch-1 generation."""
    import torch
    from transformers.utils import logging as hf_logging

    # generate() warns about its own min-length processor under assisted generation: noise here.
    hf_logging.set_verbosity_error()
    device = torch.device(s.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = (
        getattr(torch, s.dtype) if s.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    )
    model = _load(s.model_dir, device, dtype)
    pad_id = model.generation_config.pad_token_id
    pad_id = int(pad_id if isinstance(pad_id, int) else model.config.eos_token_id or 0)
    ids = _encode(s.model_dir, prompts[: max(s.requests, s.assisted)], s.chat)
    rows: list[BaselineRow] = []
    _generate(model, [ids[0]], 2, pad_id)  # warm-up: first-call allocations and kernels
    n = min(s.requests, len(ids))
    walls, lats, useful = [], [], 0
    for start in range(0, n, s.batch_size):
        batch, lengths = ids[start : start + s.batch_size], max_tokens[start : start + s.batch_size]
        wall = _generate(model, batch, max(lengths), pad_id)
        walls.append(wall)
        lats += [wall] * len(batch)
        useful += sum(lengths)
    rows.append(_row(f"hf-generate b={s.batch_size}", useful, walls, lats,
                     f"static batches of {s.batch_size}, left padding, {n} prompts"))  # fmt: skip
    if s.assisted > 0 and s.drafter_dir:
        drafter = _load(s.drafter_dir, device, dtype)
        k = min(s.assisted, len(ids))
        for name, kw in (("hf-generate b=1", {}), ("hf-assisted b=1", {"assistant_model": drafter})):
            w = [_generate(model, [ids[i]], max_tokens[i], pad_id, **kw) for i in range(k)]
            note = f"{k} prompts one at a time" + (f", assistant_model={s.drafter_dir}" if kw else "")
            rows.append(_row(name, sum(max_tokens[:k]), w, w, note))
    return rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.load.workloads import load_workload

    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_baseline", description=__doc__.split("\n\n")[0])
    p.add_argument("workload")
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--assisted", type=int, default=8)
    p.add_argument("--completions", action="store_true", help="raw prompts instead of the chat template")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    prompts = [it.prompt for it in load_workload(args.workload).items]
    s = BaselineSettings(
        args.model, not args.completions, args.batch_size, args.requests, args.assisted, args.drafter
    )
    rows = run_baseline(s, prompts, [args.max_tokens] * len(prompts))
    for r in rows:
        print(f"{r.name:18} {r.requests:4d} req  {r.tok_s:8.1f} tok/s  p50 {r.e2e_p50:.2f}s  {r.note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
