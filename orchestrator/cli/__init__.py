"""The `orchestrator` (and `lanefold`) command: one module per command group, `main` here.

`_main` builds the parser from each group's `add_commands(sub, common)` and answers signals
while the command starts; `_shared` holds what the groups share (errors, interruptible runs,
the store a command opens). Only this package writes to the terminal.
"""

from __future__ import annotations

from lanefold.cli._main import main

__all__ = ("main",)
