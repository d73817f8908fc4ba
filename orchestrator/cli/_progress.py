"""The live line of an eval on a terminal: questions done, accuracy so far, spend, ETA."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from lanefold.evaluate import QuestionResult

__all__ = ("EvalProgress",)


class EvalProgress:
    """A rich progress bar fed by `run_eval`'s `on_start` and `on_result`; questions recorded
    before this invocation count as done but not toward the ETA."""

    def __init__(self, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn("eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("accuracy {task.fields[accuracy]}"),
            TextColumn("spend ${task.fields[spend]:.4f}"),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console or Console(),
            transient=True,
        )
        self._task: TaskID | None = None
        self.done = self.correct = 0
        self.spend = 0.0

    def __enter__(self) -> EvalProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def start(self, total: int, done: Sequence[QuestionResult]) -> None:
        """The eval's size and the rows an earlier invocation recorded."""
        for row in done:
            self._count(row)
        self._task = self._progress.add_task(
            "eval", total=total, completed=self.done, accuracy=self._accuracy(), spend=self.spend
        )

    def add(self, row: QuestionResult) -> None:
        """One more question finished."""
        self._count(row)
        if self._task is not None:
            self._progress.update(self._task, advance=1, accuracy=self._accuracy(), spend=self.spend)

    def _count(self, row: QuestionResult) -> None:
        self.done += 1
        self.correct += row.correct
        self.spend += row.cost

    def _accuracy(self) -> str:
        return f"{self.correct / self.done:.3f}" if self.done else "-"
