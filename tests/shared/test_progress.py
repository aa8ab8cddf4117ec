"""Long work says where it is: at most a line a second (a moved clock here, no sleeping), and
a ticking thread for one long call."""

from __future__ import annotations

import threading

from shared.progress import Progress, duration, ticking


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_counted_work_says_a_line_a_second_with_its_eta() -> None:
    lines: list[str] = []
    clock = Clock()
    p = Progress("training", 100, "steps", say=lines.append, clock=clock)
    for step in range(1, 11):  # ten steps in 0.9 s: no line yet
        clock.now = step * 0.09
        p.update(step)
    assert lines == []
    clock.now = 1.0
    p.update(11, "loss 2.5")
    assert lines == ["training: 11/100 steps (11%), 11 steps/s, ETA 8 s, 1 s in — loss 2.5"]
    p.said_elsewhere()
    clock.now = 1.5
    p.update(20)
    assert len(lines) == 1  # a line went out another way half a second ago
    clock.now = 600.0
    p.update(50)
    assert lines[-1].startswith("training: 50/100 steps (50%), 12 s each, ETA 10 min 00 s, 10 min 00 s in")
    p.total = None
    p.finish()
    assert lines[-1] == "training: 50 steps, 12 s each, 10 min 00 s in" and p.lines == 3


def test_durations() -> None:
    assert [duration(s) for s in (0.2, 59.4, 61, 3600 * 2 + 125)] == [
        "0 s",
        "59 s",
        "1 min 01 s",
        "2 h 02 min",
    ]


def test_one_long_call_ticks_until_it_ends() -> None:
    lines: list[str] = []
    got = threading.Event()

    def say(text: str) -> None:
        lines.append(text)
        if len(lines) >= 3:
            got.set()

    with ticking("exporting", say, every_s=0.01) as tick:
        tick.stage("loading")
        assert got.wait(30)  # three lines came
    assert all(line.startswith("exporting: loading, ") and line.endswith(" s") for line in lines)
    assert not any(t.name == "ticking exporting" for t in threading.enumerate())  # joined: no more lines
