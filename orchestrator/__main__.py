"""`python -m orchestrator`: the same command as `orchestrator`."""

import sys

from lanefold.cli import main

sys.exit(main())
