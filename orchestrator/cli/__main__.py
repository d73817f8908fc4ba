"""`python -m lanefold.cli`: the same command as `orchestrator`."""

import sys

from lanefold.cli._main import main

sys.exit(main())
