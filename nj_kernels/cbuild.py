"""Compile a C kernel of this package once per source, flags and machine, and cache it.

``-march=native`` makes the object depend on the CPU it was built on, so the cache key is the
source (and the headers beside it, which it may include), the flags, the compiler's target and
this CPU's flags; the object lives under
``$NIGHTJAR_KERNEL_CACHE`` (default ``~/.cache/nightjar``)/kernels. Processes that build at
once each write their own temporary file and rename it into place (atomic).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path


def machine_key() -> str:
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


def cache_dir() -> Path:
    home_cache = os.path.join(os.path.expanduser("~"), ".cache", "nightjar")
    return Path(os.environ.get("NIGHTJAR_KERNEL_CACHE") or home_cache) / "kernels"


def compile_cached(source: Path, flags: list[str], out_dir: Path | None = None) -> Path:
    """The shared object of ``source`` built with ``flags`` (built now if not cached). Raises
    ``RuntimeError`` when it cannot be built here."""
    headers = sorted(source.parent.glob("*.h"))
    code = source.read_bytes() + b"".join(h.name.encode() + h.read_bytes() for h in headers)
    key = hashlib.sha256(code + " ".join(flags).encode() + machine_key().encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    out = out_dir / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        cmd = [cc, *flags, "-o", tmp, str(source)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[:500]}")
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot build {source.name}: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
