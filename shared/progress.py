"""Progress of long work, a line at most once a second, so nobody stares at a silent terminal.

- ``Progress``: for work done in counted pieces (training steps, benchmark requests, prompts
  labelled): ``update(done)`` prints ``what: done/total (x%), rate/s, ETA`` when a second has
  passed since the last line, and ``finish()`` prints the last one.
- ``ticking``: for one long call that reports nothing (a pip install, loading a checkpoint):
  a thread prints ``what: stage, N s`` every second until the block ends.

Lines go to a ``say`` callable (``print`` to stderr by default; a logger's method works too),
and the clock is injectable so tests need no sleeping.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Say = Callable[[str], None]


def stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    s = max(int(seconds + 0.5), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Counted work: at most one line every ``every_s`` seconds, and one at the end."""

    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "",
        say: Say = stderr_line,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.unit, self.say, self.every_s, self.clock = (
            what,
            total,
            unit,
            say,
            every_s,
            clock,
        )
        self.start = self.last = clock()
        self.done = 0
        self.lines = 0

    def update(self, done: int | None = None, note: str = "") -> None:
        """``done`` pieces so far (default: one more); a line if one is due."""
        self.done = self.done + 1 if done is None else done
        now = self.clock()
        if now - self.last >= self.every_s:
            self._line(now, note)

    def said_elsewhere(self) -> None:
        """A line about this work just went out another way: the next one is due a second later."""
        self.last = self.clock()

    def finish(self, note: str = "") -> None:
        self._line(self.clock(), note)

    def line(self, now: float | None = None, note: str = "") -> str:
        now = self.clock() if now is None else now
        elapsed = now - self.start
        unit = f" {self.unit}" if self.unit else ""
        parts = [
            f"{self.done}/{self.total}{unit} ({self.done / self.total:.0%})"
            if self.total
            else f"{self.done}{unit}"
        ]
        if elapsed > 0 and self.done:
            rate = self.done / elapsed
            parts.append(f"{rate:.3g}{unit}/s" if rate >= 1 else f"{1 / rate:.3g} s each")
            if self.total and self.done < self.total:
                parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        parts.append(f"{duration(elapsed)} in")
        return f"{self.what}: {', '.join(parts)}" + (f" — {note}" if note else "")

    def _line(self, now: float, note: str) -> None:
        self.last = now
        self.lines += 1
        self.say(self.line(now, note))


class Ticker:
    """What ``ticking`` yields: ``stage(text)`` names what the work does now."""

    def __init__(self, what: str, say: Say, clock: Callable[[], float]) -> None:
        self.what, self.say, self.clock = what, say, clock
        self.start = clock()
        self.current = ""

    def stage(self, text: str) -> None:
        self.current = text

    def line(self) -> str:
        stage = f"{self.current}, " if self.current else ""
        return f"{self.what}: {stage}{duration(self.clock() - self.start)}"


@contextmanager
def ticking(what: str, say: Say = stderr_line, every_s: float = 1.0) -> Iterator[Ticker]:
    """A line every ``every_s`` seconds from a thread while the block runs."""
    ticker = Ticker(what, say, time.monotonic)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            say(ticker.line())

    thread = threading.Thread(target=run, name=f"ticking {what}", daemon=True)
    thread.start()
    try:
        yield ticker
    finally:
        stop.set()
        thread.join()
