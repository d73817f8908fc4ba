"""The one exception tree of the library.

    LanefoldError
    ├── ConfigError                 misuse: bad config, bad call, bad input (exit 2)
    │   ├── RunNotFoundError        resume/show of a run id with no log
    │   ├── RunInUseError           another process is writing the run (exit 2)
    │   ├── StoreError              the store cannot be used as given: a runs folder it cannot
    │   │                           write, a database it cannot reach (a server's fault, not
    │   │                           its client's: the gateway answers 500 without its words)
    │   ├── NonDeterminismError     on resume, a loop asked for a wave unlike the one recorded
    │   ├── BudgetTooSmallError     an equal budget below what a loop must spend to run as itself
    │   └── PluginImportError       a `module:attr` a config key names cannot be imported
    │       └── PluginNotImportedError  a reader of a record (tail, show) did not import it
    ├── LogCorruptError             a bad line inside an event log, or one not the run's own (exit 2)
    │   └── LogTooNewError          a line written in a newer event schema than this reads
    └── RunError                    run-time failure of a run (exit 1)
        ├── LogWriteError           a record could not be written (disk full, I/O error, a
        │                           store gone): the machine's failure, not the run's
        ├── BudgetExhaustedError    the budget cannot fund the quorum (exit 3)
        ├── QuorumNotMetError       too few lanes completed to reduce
        └── BackendError            one backend attempt failed
            ├── RateLimitError          retryable, may carry retry_after
            ├── ServerError             retryable
            ├── BackendTimeoutError     retryable
            ├── BadResponseError        retryable: malformed or truncated body
            ├── ContextLengthError      not retryable: the prompt does not fit
            ├── RequestRejectedError    not retryable: 4xx carrying the server's message
            └── AuthenticationError     not retryable and fatal: cancels the wave

Whether an error is the machine's (`machine_failure`: never a question's result, the run
stays resumable), whether it is retryable, and how long to wait, is data on the instance,
never a guess at the call site.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = (
    "AuthenticationError",
    "BackendError",
    "BackendTimeoutError",
    "BadResponseError",
    "BudgetExhaustedError",
    "BudgetTooSmallError",
    "ConfigError",
    "ContextLengthError",
    "LanefoldError",
    "LogCorruptError",
    "LogTooNewError",
    "LogWriteError",
    "NonDeterminismError",
    "PluginImportError",
    "PluginNotImportedError",
    "QuorumNotMetError",
    "RateLimitError",
    "RequestRejectedError",
    "RunError",
    "RunInUseError",
    "RunNotFoundError",
    "ServerError",
    "StoreError",
)


class LanefoldError(Exception):
    """Root of every error the library raises on purpose."""

    exit_code: ClassVar[int] = 1
    # The machine failed (a full disk, an I/O error, a store gone), not the run: its record is
    # left open for resume, and an eval stops instead of scoring the question as failed.
    machine_failure: ClassVar[bool] = False


class ConfigError(LanefoldError):
    """Misuse: a config, argument or input that can never work as given."""

    exit_code: ClassVar[int] = 2


class RunNotFoundError(ConfigError):
    """No event log exists for the run id."""


class StoreError(ConfigError):
    """The store cannot hold or give a run as given (its folder cannot be written, its
    database cannot be reached): one line naming the place, for whoever runs the store."""


class RunInUseError(ConfigError):
    """Another process holds the run's writer lock: one writer per run."""

    def __init__(self, run_id: str, pid: int | None) -> None:
        who = f" (pid {pid})" if pid is not None else " (pid unknown)"
        super().__init__(f"run {run_id} is being written by another process{who}")
        self.run_id = run_id
        self.pid = pid


class NonDeterminismError(ConfigError):
    """A resumed loop asked for a wave whose spec differs from the one its log recorded: the
    loop or its config changed since the crash. Refused rather than mixing two runs in one."""


class BudgetTooSmallError(ConfigError):
    """An equal budget (`compare`, `sweep`) below what a loop must spend to run as itself: its
    least lanes, or a debate's first rebuttal round. `compare` refuses it; `sweep` shows the
    point as one the loop cannot run, never as a point."""


class PluginImportError(ConfigError):
    """The `module:attr` a config key (or a flag) names cannot be imported: no such module from
    the config's folder, the working directory or `sys.path`, no such attribute, or a module that
    failed (or exited) as it imported. `key` is the key that named it, `spec` what it said."""

    def __init__(self, message: str, *, key: str, spec: str) -> None:
        super().__init__(message)
        self.key = key
        self.spec = spec


class PluginNotImportedError(PluginImportError):
    """A reader of a record (`tail`, `show`) imports no plug-in's code: the `module:attr` the
    record names was not imported yet, so it is left unchecked rather than run."""


class LogCorruptError(LanefoldError):
    """An event log has a bad line that is not a torn tail; names the line."""

    exit_code: ClassVar[int] = 2

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: corrupt event log line: {reason}")
        self.path = path
        self.line = line


class LogTooNewError(LogCorruptError):
    """A line of an event log claims an event schema newer than this library reads: written
    by a newer lanefold. Refused whole rather than misread; not corrupt, so it says so."""

    def __init__(self, path: str, line: int, schema: int, reads_up_to: int) -> None:
        LanefoldError.__init__(
            self,
            f"{path}:{line}: written by a newer lanefold: schema {schema}, this reads up to {reads_up_to}",
        )
        self.path = path
        self.line = line
        self.schema = schema


class RunError(LanefoldError):
    """A run failed while running."""


class LogWriteError(RunError):
    """A write of the record failed (an event log's append, an eval's results); what was
    written before it stands."""

    machine_failure: ClassVar[bool] = True


class BudgetExhaustedError(RunError):
    """The remaining budget cannot fund the minimum quorum of lanes."""

    exit_code: ClassVar[int] = 3


class QuorumNotMetError(RunError):
    """Fewer lanes completed than the loop's quorum."""


class BackendError(RunError):
    """One backend attempt failed. `retryable` and `retry_after` steer the dispatch path."""

    retryable: ClassVar[bool] = False
    fatal: ClassVar[bool] = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimitError(BackendError):
    """The server asked us to slow down (HTTP 429); honours `retry_after`."""

    retryable = True


class ServerError(BackendError):
    """A transient server-side fault (HTTP 5xx, 503 overloaded)."""

    retryable = True


class BackendTimeoutError(BackendError):
    """The attempt did not answer within its timeout."""

    retryable = True


class BadResponseError(BackendError):
    """A malformed, truncated or short response body."""

    retryable = True


class ContextLengthError(BackendError):
    """The prompt plus max tokens does not fit the model's context."""


class RequestRejectedError(BackendError):
    """The server rejected the request (4xx); carries the server's message."""


class AuthenticationError(BackendError):
    """Credentials were refused: no lane can succeed, so the wave is cancelled."""

    fatal = True
