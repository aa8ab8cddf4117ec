"""Host memory laid out for streaming a model's CPU weights: ``pack(tensors)`` copies them back
to back into one 2 MiB-aligned anonymous mapping advised for transparent huge pages.

Why: a decode forward reads every weight once, in layer order, and is bound by that read. On
the project's machine (2026-12-04, interleaved rounds, one core) the skinny kernel's pass over
SmolLM2's matrices at one row took 38.2-39.3 ms with 4 KiB pages and 30.6 ms with 2 MiB pages
(the best plain read of the same bytes: 38.7 and 28.4 ms): with small pages every 4 KiB costs
a TLB miss and stops the hardware prefetchers. One block in reading order also lets them (and
the kernel's software prefetch) run from one matrix into the next. Where the kernel grants no
huge pages the block is still aligned and in order. Packing copies the weights once at load
(a transient extra copy of them while the loader's tensors are still referenced).

The mapping is private (a shared anonymous mapping is shmem, which THP leaves alone here) and
lives as long as any tensor packed into it. Each tensor starts on a 64-byte cache line.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from pathlib import Path

import torch

HUGE = 2 << 20
ALIGN = 64


def pack(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous copies of the CPU ``tensors``, in this order, in one fresh arena (the same
    dtypes and shapes; a tensor listed twice is copied twice: dedupe first)."""
    offsets, size = [], 0
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError("weight_arena.pack takes CPU tensors")
        size = -(-size // ALIGN) * ALIGN
        offsets.append(size)
        size += t.numel() * t.element_size()
    if not tensors:
        return []
    area = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: faults then take 2 MiB pages
    raw = torch.frombuffer(area, dtype=torch.uint8)  # keeps the mapping alive while any view lives
    start = (-raw.data_ptr()) % HUGE
    out = []
    for t, off in zip(tensors, offsets, strict=True):
        nbytes = t.numel() * t.element_size()
        view = raw[start + off : start + off + nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
    return out


def huge_page_bytes(t: torch.Tensor) -> int:
    """Bytes of huge pages backing the mapping that holds ``t`` (from /proc/self/smaps; 0 where
    it cannot tell): what tests and benchmarks check the advice against."""
    addr = t.data_ptr()
    try:
        lines = Path("/proc/self/smaps").read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def thp_enabled() -> bool:
    """Whether this kernel grants transparent huge pages to memory advised for them."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(encoding="utf-8")
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode
