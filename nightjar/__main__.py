"""``python -m nightjar`` is the ``nightjar`` command."""

import sys

from nightjar.cli import main

sys.exit(main())
