"""Evaluating loops on datasets: `orchestrator eval`, `compare` and `curve`."""

from __future__ import annotations

from orchestrator.evaluate._item import Item

__all__ = ("Item",)
