"""`python -m training ...`: the same subcommands as `nightjar models ...`."""

import sys

from training.cli import main

raise SystemExit(main(sys.argv[1:]))
