"""A Session that runs jobs: each new run with its own seed, an existing run resumed.

An executor's workers need this: one loaded backend for many questions, question i run with its
own loop seed (`Session.run(..., seed=)`), and a job handed out again after a crash continuing
its run.
"""

from __future__ import annotations

import anyio.to_thread

from lanefold.execution._executor import Job
from lanefold.execution._session import Session
from lanefold.primitives import RunResult

__all__ = ("JobSession",)


class JobSession(Session):
    """A Session that runs `Job`s: a new one with its seed, one whose log exists resumed."""

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds a log of `run_id` (a job to resume, not to start)."""
        return self.store.exists(run_id)

    async def run_job(self, job: Job) -> RunResult:
        """Run the job's question with its seed, or resume its run when a log of it exists."""
        if await anyio.to_thread.run_sync(self.has_run, job.run_id):  # a database round trip
            return await self.resume(job.run_id)
        return await self.run(job.question, run_id=job.run_id, seed=job.seed, tools=job.tools or None)
