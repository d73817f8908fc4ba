"""The command-line tests' fixtures: a runs folder, and one finished run shared by the modules."""

from cli_support import _finished_once, finished, runs  # noqa: F401  # fixtures, found by name
