"""The view's fixtures: a finished run (the CLI tests' one), the view served on loopback."""

from cli_support import _finished_once, finished, runs  # noqa: F401  # fixtures, found by name
