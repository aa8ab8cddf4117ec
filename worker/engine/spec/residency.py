"""Moving a drafter's weights between the device and host memory, in the background.

On CUDA an offload copies every weight into pinned host memory with non-blocking copies on
a side stream (which first waits for the work already queued on the main stream), and a
reload allocates device tensors on the main stream and fills them on the side stream; the
engine polls ``done()`` (a CUDA event) at each step and calls ``finish()`` to swap the
tensors in, which frees the old ones. The main stream never waits on a copy.

On a CPU the device *is* host memory: an offload copies the weights into fresh tensors and
drops the originals (nothing is freed overall), a reload does the same in a background
thread. The engine's memory budget is what changes: the offloaded bytes stop counting
against it, and the target's KV pool grows into them (see docs/speculation.md).
"""

from __future__ import annotations

import threading
import time
from dataclasses import fields

import torch

from worker.engine.model import DecoderModel, LayerWeights


def _slots(model: DecoderModel) -> list[tuple[object, str]]:
    """Every (owner, attribute) that holds a weight tensor (a model that also references
    another's tensors, like a feature drafter, names its own with ``weight_slots``)."""
    own = getattr(model, "weight_slots", None)
    if own is not None:
        return list(own())
    slots: list[tuple[object, str]] = [(model, "embed"), (model, "norm"), (model, "lm_head")]
    for layer in model.layers:
        slots += [(layer, f.name) for f in fields(LayerWeights) if getattr(layer, f.name) is not None]
    return slots


class WeightMover:
    """One move at a time: ``start(to_host)``, then ``done()`` until True, then ``finish()``."""

    def __init__(self, model: DecoderModel) -> None:
        self.model = model
        self.device = model.device
        self.on_host = False
        self._new: dict[int, torch.Tensor] = {}  # id(old tensor) -> its copy
        self._event: torch.cuda.Event | None = None
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self.moving = False

    @property
    def nbytes(self) -> int:
        unique = {id(t): t for t in (getattr(o, a) for o, a in _slots(self.model))}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def _targets(self) -> list[torch.Tensor]:
        return list({id(t): t for t in (getattr(o, a) for o, a in _slots(self.model))}.values())

    def start(self, to_host: bool) -> None:
        if self.moving or to_host == self.on_host:
            raise RuntimeError("a weight move is running, or the weights are already there")
        self.moving, self._started, self._new = True, time.perf_counter(), {}
        sources = self._targets()
        if self.device.type == "cuda":
            main = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            dests = [
                torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                if to_host
                else torch.empty(t.shape, dtype=t.dtype, device=self.device)
                for t in sources
            ]
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for src, dst in zip(sources, dests, strict=True):
                    dst.copy_(src, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(side)
            self._new = {id(s): d for s, d in zip(sources, dests, strict=True)}
        elif to_host:
            self._new = {id(t): t.clone() for t in sources}
        else:
            self._thread = threading.Thread(target=self._copy_all, args=(sources,), daemon=True)
            self._thread.start()

    def _copy_all(self, sources: list[torch.Tensor]) -> None:
        self._new = {id(t): t.clone() for t in sources}

    def done(self) -> bool:
        if not self.moving:
            return True
        if self._event is not None:
            return bool(self._event.query())
        return self._thread is None or not self._thread.is_alive()

    def finish(self) -> float:
        """Swap the copies in (after ``done()``); returns the move's seconds from its start."""
        if not self.done():
            raise RuntimeError("the weight move has not finished")
        if self._thread is not None:
            self._thread.join()
        if self._event is not None and self.device.type == "cuda" and self.on_host:
            torch.cuda.current_stream(self.device).wait_event(self._event)
        for owner, attr in _slots(self.model):
            setattr(owner, attr, self._new[id(getattr(owner, attr))])
        self.model.weights_changed()
        self.on_host = not self.on_host
        self.moving, self._new, self._event, self._thread = False, {}, None, None
        return time.perf_counter() - self._started
