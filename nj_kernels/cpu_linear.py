"""``linear(x, w, bias)`` for the engine's fp32 CPU path: few rows go to a skinny-GEMM kernel.

On this project's CPUs the BLAS behind ``F.linear`` is slow for 2-16 rows: a 5-row product of
SmolLM2's weights costs 1.5-2x a 1-row one, although both are bound by reading the weights
once (measured 2026-12-03: docs/benchmarks/history/). That is exactly a speculative
verification at low load (γ+1 rows a sequence), so it decided whether speculation pays there.
``skinny_linear.c`` reads each block of weight rows once and multiplies it by every input row
from cache; it is compiled here on first use (``cc -O3 -march=native``, cached by source and
machine) and called through ctypes. Where it cannot be built (no compiler, no AVX2/FMA) or does
not apply (CUDA, not fp32, more rows than ``max_rows()``), ``F.linear`` runs: the torch path is
the reference.

The kernel is batch-invariant: a row's output does not depend on the other rows or their
number (the BLAS's does, by its M-dependent paths). The forward as a whole is not (attention
over 1 or γ+1 query rows rounds differently), so exactness still rests on the verifier's rule,
as before. Its rounding differs from the BLAS's (summation order), like any two BLAS builds.

``NIGHTJAR_SKINNY``: ``auto`` (default: on where it builds), ``off``.

The kernel reads the weights in one of two orders (``skinny_linear.c``): in address order, or
in blocks of rows multiplied by every input row from registers. For one input row the address
order is the faster everywhere; for 2-6 rows it depends on the CPU (an AVX-512 AMD EPYC,
2026-12-07: 2 rows 9.7 ms in address order against 16.4 in blocks over SmolLM2-sized weights,
so a verification of γ + 1 rows cost twice a decode row; an earlier AVX2 EPYC: blocks the
faster from 3 rows). ``stream_rows`` measures both once per machine on first use (about 0.2 s,
kept beside the built library) and sets the faster per row count; both give the same bits, so
the choice never changes a result. ``NIGHTJAR_SKINNY_STREAM``: ``auto`` (default), or the row
counts to read in address order, comma-separated (``1``: the order before the measurement).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nj_kernels.quant_linear import QuantWeight, Weight

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("skinny_linear.c")
# Compiled together into one library: the skinny product, the fused decode layers that call it
# (cpu_decode.c, used by cpu_decode.py), and the headers they include.
SOURCES = [SOURCE, SOURCE.with_name("cpu_decode.c")]
HEADERS = [SOURCE.with_name("simd.h"), SOURCE.with_name("quant_linear.h")]
FLAGS = ["-O3", "-march=native", "-shared", "-fPIC"]
# Up to this many rows the kernel beats the BLAS here: SmolLM2's layer products with cold
# weights (2026-12-03), one torch thread, 24 rows: kernel 0.9x the BLAS's time; with two threads
# the BLAS splits the product across cores and is faster from ~24 rows on, so 16 there.
MAX_ROWS_ONE_THREAD = 24
MAX_ROWS_THREADS = 16
PASS_ROWS = 6  # MB in skinny_linear.c: the row counts whose reading order is chosen, 1..this
CALIBRATION_BYTES = 64 << 20  # weights each order reads per measurement: beyond the caches
CALIBRATION_REPEATS = 3  # measurements of each order per row count, alternating; the least counts
STREAM_MARGIN = 0.03  # the address order replaces the blocks for a row count only this much faster

_lib: ctypes.CDLL | None = None
_tried = False
_enabled = os.environ.get("NIGHTJAR_SKINNY", "auto") != "off"


def _machine_key() -> str:
    """What ``-march=native`` depends on: the compiler's target and this CPU's flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    return platform.machine() + flags


def _cache_dir() -> Path:
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "nightjar")
    return Path(os.environ.get("NIGHTJAR_KERNEL_CACHE") or home_cache) / "kernels"


def build(cache_dir: Path | None = None) -> Path:
    """Compile the kernel (once per source, flags and machine) and return the shared object's
    path. Raises ``RuntimeError`` when it cannot be built here."""
    source = b"".join(p.read_bytes() for p in SOURCES + HEADERS)
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _machine_key().encode()).hexdigest()[:16]
    out_dir = cache_dir or _cache_dir()
    out = out_dir / f"skinny_linear-{key}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, *map(str, SOURCES)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:500]}")
        os.replace(tmp, out)  # atomic: processes building at once each write their own file
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot build {', '.join(p.name for p in SOURCES)}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where they cannot be built here."""
    return _load()


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as exc:
        log.warning("skinny linear kernel unavailable, using torch's: %s", exc)
        return None
    fn = lib.skinny_linear
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3
    fn.restype = None
    lib.skinny_set_stream.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.skinny_set_stream.restype = None
    try:
        rows = stream_rows(lib)
    except Exception:  # the kernel still works in the order it was built with; only speed differs
        log.exception("skinny linear: measuring the reading order failed; keeping the built-in one")
        rows = [1]
    for m in range(1, PASS_ROWS + 1):
        lib.skinny_set_stream(m, int(m in rows))
    _lib = lib
    return lib


def _rows(values: object) -> list[int] | None:
    """Row counts within a pass, sorted (None: not a list of them)."""
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        return None
    return sorted({v for v in values if 1 <= v <= PASS_ROWS})


def stream_rows(lib: ctypes.CDLL, cache_dir: Path | None = None) -> list[int]:
    """The row counts the kernel reads in address order here: ``NIGHTJAR_SKINNY_STREAM``, else
    measured once per machine (``measure_stream_rows``) and kept beside the library."""
    given = os.environ.get("NIGHTJAR_SKINNY_STREAM", "auto").strip().lower()
    if given != "auto":
        values = [v.strip() for v in given.split(",") if v.strip()]
        bad = [v for v in values if not v.isdigit() or not 1 <= int(v) <= PASS_ROWS]
        if bad:
            log.warning("NIGHTJAR_SKINNY_STREAM: ignoring %s (row counts 1-%d)", bad, PASS_ROWS)
        return sorted({int(v) for v in values if v not in bad})
    source = b"".join(p.read_bytes() for p in SOURCES + HEADERS)
    settings = f"{CALIBRATION_BYTES} {CALIBRATION_REPEATS} {STREAM_MARGIN}".encode()
    key = hashlib.sha256(source + settings + " ".join(FLAGS).encode() + _machine_key().encode()).hexdigest()[
        :16
    ]
    out_dir = cache_dir or _cache_dir()
    path = out_dir / f"skinny_linear-{key}.stream.json"
    try:
        kept = _rows(json.loads(path.read_text(encoding="utf-8")))
        if kept is not None:
            return kept
    except (OSError, ValueError):
        pass
    rows = measure_stream_rows(lib)
    try:  # atomic, as build(): processes measuring at once each write their own file
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=out_dir)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(rows, f)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("skinny linear: cannot keep the measured reading order in %s: %s", out_dir, exc)
    return rows


def measure_stream_rows(lib: ctypes.CDLL) -> list[int]:
    """Each row count 2..``PASS_ROWS`` timed in both reading orders over ``CALIBRATION_BYTES``
    of weights (alternating, the least of ``CALIBRATION_REPEATS``); those the address order
    reads ``STREAM_MARGIN`` faster, and one row always: there it is the faster by design (a
    plain read)."""
    k = 576
    w = torch.empty(CALIBRATION_BYTES // (4 * k), k).uniform_(-1.0, 1.0)
    n = w.shape[0]
    out = [1]
    for m in range(2, PASS_ROWS + 1):
        x = torch.randn(m, k)
        y = torch.empty(m, n)
        best = {0: float("inf"), 1: float("inf")}
        for _ in range(CALIBRATION_REPEATS):
            for on in (0, 1):
                lib.skinny_set_stream(m, on)
                t0 = time.perf_counter()
                lib.skinny_linear(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), m, n, k)
                best[on] = min(best[on], time.perf_counter() - t0)
        lib.skinny_set_stream(m, 0)
        if best[1] < (1.0 - STREAM_MARGIN) * best[0]:
            out.append(m)
    log.info("skinny linear: rows read in address order here: %s", out)
    return out


def available() -> bool:
    return _load() is not None


def set_enabled(flag: bool) -> None:
    """Turn the kernel's use by ``linear`` on or off (benchmarks compare both in one run)."""
    global _enabled
    _enabled = flag


def max_rows() -> int:
    """Products of at most this many rows take the kernel (0: none do)."""
    if not _enabled or not available():
        return 0
    return MAX_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else MAX_ROWS_THREADS


def skinny_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel itself (no size rule): ``x [M, K]`` fp32 CPU, ``w [N, K]``, ``bias [N]``."""
    lib = _load()
    if lib is None:
        raise RuntimeError("the skinny linear kernel is not available here")
    x, w = x.contiguous(), w.contiguous()
    if bias is not None:
        bias = bias.contiguous()
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or x.dtype != torch.float32 or w.dtype != torch.float32:
        raise ValueError(f"skinny_linear: x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")
    y = torch.empty(m, n, dtype=torch.float32)
    lib.skinny_linear(
        x.data_ptr(), w.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(), m, n, k
    )
    return y


def applies(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``linear`` takes the kernel for these operands: few fp32 CPU rows."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= max_rows()
        and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (x, w))
        and w.is_contiguous()
        and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"))
    )


def linear(x: torch.Tensor, w: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)``; few fp32 CPU rows through the skinny kernel; a GGUF weight
    (``nj_kernels.quant_linear``) computes its own product from its blocks."""
    if not isinstance(w, torch.Tensor):
        return w.linear(x, bias)
    return skinny_linear(x, w, bias) if applies(x, w, bias) else F.linear(x, w, bias)


def embedding(ids: torch.Tensor, w: torch.Tensor | QuantWeight) -> torch.Tensor:
    """``F.embedding(ids, w)``; a GGUF weight dequantises just the rows asked for."""
    return F.embedding(ids, w) if isinstance(w, torch.Tensor) else w.embedding(ids)
