"""How long a worker's startup cost profile takes, and what it measured.

Loads the engine the way ``nightjar worker`` does (the bundled drafters of a bundled target,
plus prompt lookup), runs ``worker.profiling.profile_engine`` once and prints the time, the
batch sizes, rows and drafters measured, and each batch's q = 1 and q = γmax + 1 step.

    python -m benchmarks.profile_time --model models/nj-target
    python -m benchmarks.profile_time --model models/smollm2-135m-instruct --out /tmp/smol.json
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from nightjar.options import drafter_dirs
from worker.engine_factory import create_engine
from worker.profiling import ProfileSettings, profile_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/nj-target")
    ap.add_argument("--budget", type=float, default=ProfileSettings.budget_s)
    ap.add_argument("--max-batch", type=int, default=ProfileSettings.max_batch)
    ap.add_argument("--out", help="save the profile as JSON here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)7.0f ms %(message)s")
    t0 = time.perf_counter()
    engine = create_engine(args.model, drafters=drafter_dirs(args.model, None))
    load_s = time.perf_counter() - t0
    settings = ProfileSettings(budget_s=args.budget, max_batch=args.max_batch)
    profile = profile_engine(engine, Path(args.model).name, settings)
    load = os.getloadavg()[0]
    print(
        f"model {args.model}: engine load {load_s:.1f} s; load average {load:.2f} on {os.cpu_count()} cores"
    )
    if profile is None:
        print("no profile: the budget ran out before batch 1")
        return
    print(f"profile measured in {profile.measure_s:.1f} s (budget {args.budget:.0f} s)")
    print(f"batches {profile.batches}, rows {profile.rows}, drafters {list(profile.drafter_s)}")
    for i, b in enumerate(profile.batches):
        drafts = ", ".join(f"{n} {1000 * v[i]:.2f}" for n, v in profile.drafter_s.items())
        row, q = profile.target_s[i], profile.rows[-1]
        print(f"  batch {b:3d}: target q=1 {1000 * row[0]:.1f} ms, q={q} {1000 * row[-1]:.1f} ms;", end="")
        print(f" draft ms {drafts}")
    if args.out:
        Path(args.out).write_text(profile.dumps())


if __name__ == "__main__":
    main()
