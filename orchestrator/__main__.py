"""`python -m orchestrator`: the same command as `orchestrator`."""

import sys

from orchestrator._cli import main

sys.exit(main())
