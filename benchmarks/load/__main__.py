"""``python -m benchmarks.load`` is ``nightjar bench``."""

import sys

from benchmarks.load.cli import main

sys.exit(main())
