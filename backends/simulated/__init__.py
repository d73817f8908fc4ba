"""A deterministic simulated backend: the test double, and a way to show a loop without a model."""

from __future__ import annotations

from lanefold.backends.simulated._backend import SimulatedBackend, SimulatedConfig

__all__ = ("SimulatedBackend", "SimulatedConfig")
