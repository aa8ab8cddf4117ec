"""Philox-4x32-10 uniforms keyed on (seed, position, token id): the noise of keyed sampling.

Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator
of cuRAND and JAX) is counter-based: its output is a pure function of a 128-bit counter and a
64-bit key, so a token's uniform never depends on what was drawn before it
(worker/engine/keyed.py says why that matters). Element e here is token ``ids[e]`` of row
``rows[e]``: counter (id >> 2, the row's position, low and high halves, ``stream``), key = the
row's seed, and its uniform is word ``id & 3`` of the output, (w + 0.5) / 2³² — in (0, 1).

``uniforms_torch`` is the reference: torch ops on int64 tensors holding 32-bit words
(products split so nothing overflows), any device, vectorised over every element. It costs
~250 small ops a call, which on a CPU is 0.5-2 ms whatever the size — most of a step of a
small model — so on the CPU ``philox.c`` computes the same numbers in one call, and the whole
keyed draw of worker/engine/keyed.py too (``keyed_draw``): compiled on first use like
``skinny_linear.c`` (cpu_linear.py); ``NIGHTJAR_PHILOX_KERNEL=off`` or no compiler: the torch
path. ``tests/nj_kernels/test_philox.py`` checks Random123's known-answer vectors and that
both paths agree bit for bit; tests/worker/engine/test_keyed.py, that both draw alike.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from nj_kernels.cpu_linear import _cache_dir, _machine_key

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("philox.c")
FLAGS = ["-O2", "-shared", "-fPIC"]
MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox-4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # its Weyl key increments
ROUNDS = 10

Words = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # Philox's four 32-bit words

_lib: ctypes.CDLL | None = None
_tried = False
_enabled = os.environ.get("NIGHTJAR_PHILOX_KERNEL", "auto") != "off"


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a · m`` (a: int64 holding 32-bit words; m < 2³²) without
    overflowing int64: a · m = p1 · 2¹⁶ + p0, both partial products below 2⁴⁸."""
    p0 = a * (m & 0xFFFF)
    t = a * (m >> 16)
    t.add_(p0.bitwise_right_shift(16))
    lo = t.bitwise_and(0xFFFF).bitwise_left_shift_(16).bitwise_or_(p0.bitwise_and_(0xFFFF))
    return t.bitwise_right_shift_(16), lo


def round_keys(seed: int, rounds: int = ROUNDS) -> list[int]:
    """Philox's key schedule for one seed (< 2⁶⁴): the two key words of every round."""
    k0, k1, out = seed & MASK32, (seed >> 32) & MASK32, []
    for _ in range(rounds):
        out += [k0, k1]
        k0, k1 = (k0 + _W0) & MASK32, (k1 + _W1) & MASK32
    return out


def philox4x32(counter: Words, keys: torch.Tensor) -> Words:
    """Philox-4x32 (Random123's ``philox4x32_R``, R = ``len(keys) // 2``) on int64 tensors of
    32-bit words, element by element; ``keys [2R, ...]`` holds every round's two key words
    (``round_keys``), broadcast against the counter words."""
    c0, c1, c2, c3 = counter
    for r in range(keys.shape[0] // 2):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0 = hi1.bitwise_xor_(c1).bitwise_xor_(keys[2 * r])
        c2 = hi0.bitwise_xor_(c3).bitwise_xor_(keys[2 * r + 1])
        c1, c3 = lo1, lo0
    return c0, c1, c2, c3


def uniforms_torch(
    seeds: list[int], positions: list[int], rows: torch.Tensor, ids: torch.Tensor, stream: int
) -> torch.Tensor:
    """The reference ``uniforms``, in torch ops on ``ids``' device."""
    dev = ids.device
    keys = torch.tensor([round_keys(s) for s in seeds], dtype=torch.int64, device=dev).T[:, rows]
    pos = torch.tensor(positions, dtype=torch.int64, device=dev)[rows]
    words = philox4x32((ids >> 2, pos & MASK32, pos >> 32, torch.full_like(ids, stream)), keys)
    word = torch.stack(words).gather(0, (ids & 3).unsqueeze(0)).squeeze(0)
    return (word.double() + 0.5) * 2.0**-32


def uniforms(
    seeds: list[int], positions: list[int], rows: torch.Tensor, ids: torch.Tensor, stream: int
) -> torch.Tensor:
    """U(0, 1) in float64, one per element of ``rows`` / ``ids`` (int64, one dimension): the
    uniform of token ``ids[e]`` (< 2³⁴) at (``seeds[r]``, ``positions[r]``), r = ``rows[e]``
    (seeds and positions below 2⁶³), in the counter space ``stream`` (< 2³²). The kernel on
    the CPU where it builds, else ``uniforms_torch``: the same numbers."""
    lib = _load() if _enabled and ids.device.type == "cpu" else None
    if lib is None:
        return uniforms_torch(seeds, positions, rows, ids, stream)
    rows, ids = rows.to(torch.int64).contiguous(), ids.to(torch.int64).contiguous()
    if rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < len(seeds) == len(positions):
        raise ValueError("uniforms: a row without its seed and position")
    seed_t = torch.tensor(seeds, dtype=torch.int64)
    pos_t = torch.tensor(positions, dtype=torch.int64)
    out = torch.empty(ids.shape[0], dtype=torch.float64)
    lib.nj_philox_uniforms(
        seed_t.data_ptr(), pos_t.data_ptr(), rows.data_ptr(), ids.data_ptr(), ids.shape[0], stream, ROUNDS,
        out.data_ptr(),
    )  # fmt: skip
    return out


def keyed_draw(
    probs: torch.Tensor,
    seeds: list[int],
    positions: list[int],
    head_floor: float,
    streams: tuple[int, int],
) -> list[int] | None:
    """worker/engine/keyed.py's draw of every row of ``probs [N, V]`` in one call of the
    kernel (``streams``: the token clocks' and the tail's counter spaces), or None where the
    kernel does not apply (not on the CPU, or not built): the caller takes the torch path."""
    lib = _load() if _enabled and probs.device.type == "cpu" else None
    if lib is None:
        return None
    n, vocab = probs.shape
    if len(seeds) != n or len(positions) != n:
        raise ValueError("keyed_draw: one seed and one position per row")
    rows = probs.float().contiguous()
    seed_t = torch.tensor(seeds, dtype=torch.int64)
    pos_t = torch.tensor(positions, dtype=torch.int64)
    out = torch.empty(n, dtype=torch.int64)
    lib.nj_keyed_draw(
        rows.data_ptr(), n, vocab, vocab, seed_t.data_ptr(), pos_t.data_ptr(), head_floor,
        streams[0], streams[1], ROUNDS, out.data_ptr(),
    )  # fmt: skip
    return out.tolist()


def set_enabled(flag: bool) -> None:
    """Use the kernel where it builds (True) or always the torch path (tests compare both)."""
    global _enabled
    _enabled = flag


def available() -> bool:
    return _load() is not None


def build(cache_dir: Path | None = None) -> Path:
    """Compile ``philox.c`` (once per source, flags and machine); the shared object's path.
    Raises ``RuntimeError`` when it cannot be built here."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _machine_key().encode()).hexdigest()[:16]
    out_dir = cache_dir or _cache_dir()
    out = out_dir / f"philox-{key}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cc = os.environ.get("CC", "cc")
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:500]}")
        os.replace(tmp, out)  # atomic: processes building at once each write their own file
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot build {SOURCE.name}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _load() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    try:
        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError) as exc:
        log.warning("Philox kernel unavailable, using torch's ops: %s", exc)
        return None
    fn = lib.nj_philox_uniforms
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p]
    fn.restype = None
    draw = lib.nj_keyed_draw
    draw.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    draw.argtypes += [ctypes.c_void_p, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32]
    draw.argtypes += [ctypes.c_void_p]
    draw.restype = None
    _lib = lib
    return lib
