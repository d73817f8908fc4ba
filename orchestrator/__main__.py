"""`python -m orchestrator`: the same command as `orchestrator`."""

import sys

from lanefold._cli import main

sys.exit(main())
