"""The barrier: joins a wave once every lane has landed or failed for good.

It writes `wave.barrier`, makes the log durable (fsync under the `barrier` policy, awaited in
a worker thread so the event loop serves other runs meanwhile: the wave's reduce still waits
for it), then checks the quorum: too few lanes is a budget error when the budget or the clock stopped them,
else a quorum error.
"""

from __future__ import annotations

from lanefold.primitives._errors import BudgetExhaustedError, QuorumNotMetError
from lanefold.primitives._record import Recorder
from lanefold.primitives._state import WaveState
from lanefold.primitives.events import BudgetExhausted, BudgetExhaustedData, WaveBarrier, WaveBarrierData

__all__ = ("close_wave",)


async def close_wave(recorder: Recorder, state: WaveState, *, min_quorum: int, deadline_hit: bool) -> None:
    """Write the barrier, fsync, and raise if fewer than `min_quorum` lanes completed."""
    completed, failed = state.completed(), state.failed()
    recorder.emit(
        WaveBarrier,
        WaveBarrierData(completed=[s.lane for s in completed], failed=[s.lane for s in failed]),
        wave=state.wave,
    )
    await recorder.sync()
    if len(completed) >= min_quorum:
        return
    budget_failures = [
        s for s in failed if s.error and (s.error.startswith("BudgetExhausted") or "max_seconds" in s.error)
    ]
    if deadline_hit or budget_failures:
        limit = "max_seconds" if deadline_hit else "budget"
        recorder.emit(
            BudgetExhausted,
            BudgetExhaustedData(
                limit=limit,
                needed=float(min_quorum),
                available=float(len(completed)),
                k_fit=len(completed),
                min_quorum=min_quorum,
            ),
            wave=state.wave,
        )
        raise BudgetExhaustedError(
            f"budget {limit}: wave {state.wave} completed {len(completed)} lanes, "
            f"below the quorum of {min_quorum}"
        )
    last = failed[-1].error if failed else "-"
    raise QuorumNotMetError(
        f"wave {state.wave}: {len(completed)} of {state.info.k} lanes completed, below the "
        f"quorum of {min_quorum}; last error: {last}"
    )
