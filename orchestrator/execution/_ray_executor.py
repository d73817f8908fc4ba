"""Questions on a pool of Ray actors, each holding one Session (one loaded backend).

The driver keeps the queue: each actor holds up to `concurrency` jobs and takes the next one as
one finishes, so a slow worker never stalls the rest. An actor that dies (its process killed,
its machine gone) is replaced, and its unfinished jobs go back to the front of the queue: the
worker that takes one finds the run's log in the shared store and resumes it, keeping every
lane already completed and charging the lanes cut off, as any resume does. The dead writer's
lock died with it (an OS file lock with its process, an advisory lock with its connection).

Ray is optional (`pip install 'lanefold[scale]'`); it is imported when an executor is made.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import secrets
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import anyio
import anyio.to_thread
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

import lanefold.primitives as primitives
from lanefold.execution._executor import Job, JobOutcome, WorkerSpec, import_paths
from lanefold.execution._job_session import JobSession
from lanefold.execution._ray_connect import CONNECT_TIMEOUT_S, join_cluster
from lanefold.primitives import ConfigError, LanefoldError, RunError, RunInUseError, RunResult
from lanefold.primitives.internal import backend_gpus

__all__ = ("RayExecutor",)

log = logging.getLogger("lanefold.executor")


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor ray: Ray is not installed; pip install 'lanefold[scale]'") from None
    return ray


class _Worker:
    """The body of one Ray actor: one JobSession, built from the spec on first use."""

    def __init__(self, spec: WorkerSpec) -> None:
        import_paths(spec.paths)
        self.spec = spec
        self.session: JobSession | None = None
        self.running: set[str] = set()

    def pid(self) -> int:
        return os.getpid()

    def jobs(self) -> list[str]:
        """The run ids this worker is running now."""
        return sorted(self.running)

    async def run(self, job: Job) -> tuple[Any, ...]:
        """("ok", the result as JSON) or ("error", class name, message): errors travel by
        name, as not every LanefoldError pickles back through its own __init__."""
        self.running.add(job.run_id)
        try:
            if self.session is None:
                spec = self.spec
                self.session = JobSession(
                    spec.loop_config(), store=spec.store, verifier=spec.verifier, hooks=spec.worker_hooks()
                )
                self.session.source = spec.source
            # The dead worker's lock may outlive it for a moment (a server notices a lost
            # connection late): wait for it rather than fail the question.
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(RunInUseError),
                stop=stop_after_delay(30),
                wait=wait_exponential(0.05, max=2),
                sleep=anyio.sleep,
                reraise=True,
            ):
                with attempt:
                    result = await self.session.run_job(job)
        except LanefoldError as exc:
            return ("error", type(exc).__name__, str(exc))
        finally:
            self.running.discard(job.run_id)
        return ("ok", result.model_dump(mode="json"))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.aclose()


def _error(name: str, message: str) -> LanefoldError:
    """The worker's error as its own class (found by name), carrying its message."""
    found: object = getattr(primitives, name, None)
    cls: type[LanefoldError] = RunError
    if isinstance(found, type) and issubclass(found, LanefoldError):
        cls = found
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


class RayExecutor:
    """Runs a Session's questions on `workers` Ray actors, one Session (one backend) each.

    `address`: None starts a local cluster (shut down by `close()`); "auto" joins the
    cluster running on this machine; else a cluster's address (`ray://host:10001` through
    Ray's client). Joining takes at most `connect_timeout_s` (an address nothing listens on
    is said at once), else a ConfigError. `num_cpus`/`num_gpus` are each actor's resources;
    `num_gpus=None` asks
    one GPU per worker (one engine per GPU) when the config's backend is the engine on "cuda",
    or on "auto" in a cluster with GPUs, else none. `runtime_env` ships code or packages to
    a remote cluster's workers. More than `max_replacements` dead workers end the batch.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        workers: int = 2,
        *,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        runtime_env: dict[str, Any] | None = None,
        max_replacements: int | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"--workers: must be at least 1, got {workers}")
        if num_cpus < 0 or (num_gpus or 0) < 0:
            raise ConfigError("executor ray: num_cpus and num_gpus must not be negative")
        if not (math.isfinite(connect_timeout_s) and connect_timeout_s > 0):
            raise ConfigError(
                f"--ray-connect-timeout: must be a number of seconds above 0, got {connect_timeout_s}"
            )
        _ray()  # a missing Ray is said now, before anything is written
        self.address, self.workers = address, workers
        self.connect_timeout_s = connect_timeout_s
        self.num_cpus, self.num_gpus, self.runtime_env = num_cpus, num_gpus, runtime_env
        self.max_replacements = 2 * workers + 2 if max_replacements is None else max_replacements
        self._started = False

    def connect(self) -> None:
        """Start or join the cluster (once)."""
        ray = _ray()
        if ray.is_initialized():
            return
        quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        if self.address is None:
            cpus = max(int(self.workers * self.num_cpus + 0.999), os.cpu_count() or 1)
            # Loopback only: a cluster of this machine binds nothing another machine reaches.
            ray.init(
                num_cpus=cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                object_store_memory=200 * 1024 * 1024,
                **quiet,
            )
            self._started = True
        else:
            join_cluster(ray, self.address, quiet, self.connect_timeout_s)

    def gpus_for(self, spec: WorkerSpec) -> float:
        """Each worker's GPUs: as given, else one for the engine on a GPU."""
        if self.num_gpus is not None:
            return self.num_gpus
        wants = backend_gpus(spec.loop_config().backend)
        if wants is not None:
            return wants
        return 1 if _ray().cluster_resources().get("GPU", 0) >= 1 else 0

    def close(self) -> None:
        """Shut down the cluster this executor started (a joined one is left running)."""
        if self._started:
            _ray().shutdown()
            self._started = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def outcomes(
        self, spec: WorkerSpec, jobs: Sequence[Job], concurrency: int
    ) -> AsyncGenerator[JobOutcome, None]:
        """Every job's outcome, each once; see the module docstring for who runs what."""
        if concurrency < 1:
            raise ConfigError(f"concurrency: must be at least 1, got {concurrency}")
        if not jobs:
            return
        self.connect()
        pool = _Pool(_ray(), self, spec, concurrency, self.gpus_for(spec))
        try:
            async with contextlib.aclosing(pool.drain(list(jobs))) as drained:
                async for outcome in drained:
                    yield outcome
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(pool.stop)


class _Pool:
    """The actors of one batch of jobs, and which job each one holds."""

    def __init__(
        self, ray: Any, executor: RayExecutor, spec: WorkerSpec, concurrency: int, gpus: float
    ) -> None:
        self.ray, self.executor, self.spec, self.concurrency = ray, executor, spec, concurrency
        self.gpus = gpus
        self.tag = secrets.token_hex(3)
        self.actors: list[Any] = []  # by slot; a dead actor's slot gets its replacement
        self.generation: list[int] = []
        self.flight: dict[Any, tuple[int, int, Job]] = {}  # ref -> (slot, generation, job)
        self.replaced = 0
        self.remote = ray.remote(_Worker)

    def start(self, slot: int) -> None:
        executor = self.executor
        generation = self.generation[slot] + 1 if slot < len(self.actors) else 0
        actor = self.remote.options(
            name=f"lanefold-{self.tag}-{slot}-{generation}",
            namespace="lanefold",
            num_cpus=executor.num_cpus,
            num_gpus=self.gpus,
            runtime_env=executor.runtime_env,
            max_concurrency=self.concurrency + 2,
        ).remote(self.spec)
        if slot < len(self.actors):
            self.actors[slot], self.generation[slot] = actor, generation
        else:
            self.actors.append(actor)
            self.generation.append(generation)

    def fill(self, queue: collections.deque[Job]) -> None:
        load = collections.Counter(slot for slot, _, _ in self.flight.values())
        for slot, actor in enumerate(self.actors):
            for _ in range(self.concurrency - load[slot]):
                if not queue:
                    return
                job = queue.popleft()
                self.flight[actor.run.remote(job)] = (slot, self.generation[slot], job)

    async def drain(self, jobs: list[Job]) -> AsyncGenerator[JobOutcome, None]:
        ray = self.ray
        queue = collections.deque(jobs)
        for slot in range(min(self.executor.workers, len(jobs))):
            self.start(slot)
        self.fill(queue)
        while self.flight:
            wait = functools.partial(ray.wait, list(self.flight), num_returns=1, timeout=0.5)
            ready, _ = await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)
            for ref in ready:
                slot, generation, job = self.flight.pop(ref)
                try:
                    reply = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    queue.appendleft(job)  # resumed from its log by whichever worker takes it
                    if generation == self.generation[slot]:  # not replaced yet
                        self.replace(slot, exc)
                    continue
                if reply[0] == "ok":
                    yield JobOutcome(job, result=RunResult.model_validate(reply[1]))
                else:
                    yield JobOutcome(job, error=_error(reply[1], reply[2]))
            self.fill(queue)

    def replace(self, slot: int, exc: BaseException) -> None:
        self.replaced += 1
        if self.replaced > self.executor.max_replacements:
            raise RunError(
                f"executor ray: {self.replaced} workers died; giving up "
                f"(last: {' '.join(str(exc).split())[:200]})"
            )
        log.warning("ray worker %d died; starting another: %s", slot, type(exc).__name__)
        with contextlib.suppress(Exception):
            self.ray.kill(self.actors[slot])
        self.start(slot)

    def stop(self) -> None:
        """Interrupt the jobs still in flight (their runs record it), close the sessions,
        end the actors."""
        ray = self.ray
        for ref in self.flight:
            ray.cancel(ref)
        if self.flight:
            ray.wait(list(self.flight), num_returns=len(self.flight), timeout=10)
        closing = [actor.close.remote() for actor in self.actors]
        ray.wait(closing, num_returns=len(closing), timeout=10)
        for actor in self.actors:
            ray.kill(actor)
        self.actors.clear()
