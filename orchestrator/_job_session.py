"""A Session that runs jobs: each new run with its own seed, an existing run resumed.

An eval's questions and an executor's workers both need this: one loaded backend for many
questions, question i run with its own loop seed (set for the task that starts it, so runs in
flight at once keep theirs), and a job handed out again after a crash continuing its run.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import anyio.to_thread

from lanefold._config import LoopConfig
from lanefold._executor import Job, with_seed
from lanefold._result import RunResult
from lanefold._session import Session

__all__ = ("JobSession",)


class JobSession(Session):
    """A Session whose new run takes the config set for the task that starts it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.question_config: ContextVar[LoopConfig | None] = ContextVar("question_config",
                                                                         default=None)

    @property
    def config(self) -> LoopConfig:
        return self.question_config.get() or super().config

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds a log of `run_id` (a job to resume, not to start)."""
        return self.store.exists(run_id)

    async def run_job(self, job: Job) -> RunResult:
        """Run the job's question with its seed, or resume its run when a log of it exists."""
        if await anyio.to_thread.run_sync(self.has_run, job.run_id):  # a database round trip
            return await self.resume(job.run_id)
        token = self.question_config.set(with_seed(super().config, job.seed))
        try:
            return await self.run(job.question, run_id=job.run_id)
        finally:
            self.question_config.reset(token)
