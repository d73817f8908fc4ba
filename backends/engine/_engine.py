"""The synchronous engine: requests in, one scheduled model step at a time, lanes out.

A request's prompt is prefilled once by its leading lane; the other lanes are forked from it
(sharing its KV blocks) and every running lane of every request decodes in one batch per step.
Each step hands back the lanes that finished in it, so a caller can deliver a short lane while
the long lanes of its request decode on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import Tensor

from lanefold.backends.engine._blocks import BlockPool
from lanefold.backends.engine._config import EngineConfig
from lanefold.backends.engine._decode_paths import DecodePaths
from lanefold.backends.engine._grammar import Grammar, Grammars, allowed_tokens
from lanefold.backends.engine._metrics import EngineMetrics, RequestMetrics, charge_residency
from lanefold.backends.engine._model import CausalLM, build_model
from lanefold.backends.engine._runner import ModelRunner
from lanefold.backends.engine._sampler import SamplingBatch, lane_key, sample, sample_with_alternatives
from lanefold.backends.engine._scheduler import Scheduler, Step
from lanefold.backends.engine._sequence import Alternatives, EngineRequest, Sequence, Status
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.backends.engine._weight_cache import cached_checkpoint, cached_tokenizer, open_lazily
from lanefold.backends.engine._weights import load_checkpoint, resolve_model_path
from lanefold.primitives import ConfigError, ContextLengthError, LaneRequest, SamplingParams

__all__ = ("Engine", "ThreadTuner", "busy_cores", "default_threads", "load_tokenizer")

logger = logging.getLogger(__name__)

_CPU_KV_BYTES = 512 << 20  # the KV pool's memory figure on CPU
_CUDA_KV_FRACTION = 0.4  # of the GPU memory still free once the weights are loaded


class Engine:
    """Paged-KV continuous-batching engine over one model on one device."""

    def __init__(
        self,
        model: CausalLM,
        *,
        num_blocks: int,
        block_size: int = 16,
        max_batch_lanes: int = 64,
        tokenizer: Tokenizer | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.pool = BlockPool(num_blocks, block_size)
        self.scheduler = Scheduler(self.pool, max_batch_lanes)
        self.runner = ModelRunner(model, num_blocks, block_size, model.lm_head.weight.dtype)
        self.metrics = EngineMetrics()
        self.eos_ids = frozenset(model.args.eos_token_ids)
        self.grammars = (
            None
            if tokenizer is None
            else Grammars(tokenizer, model.args.vocab_size, model.args.eos_token_ids)
        )
        self._clock = clock
        self._mark: float | None = None
        self._live: list[EngineRequest] = []
        self._finished: list[Sequence] = []  # lanes finished in the step under way

    @classmethod
    def from_config(cls, config: EngineConfig, tokenizer: Tokenizer | None = None) -> Engine:
        """Load the configured model (and its tokenizer, unless given) onto its device."""
        threads: list[int] = [] if config.threads is None else [config.threads]
        # The busy cores are sampled while the weights load (a tenth of a second, not added).
        sampler = threading.Thread(target=lambda: threads.append(default_threads()), daemon=True)
        if not threads:
            sampler.start()
        device = _device(config.device)
        dtype = _dtype(config.dtype, device)
        path = resolve_model_path(config.model)
        if tokenizer is None:
            tokenizer = _load_tokenizer(path)
        if path.is_file():  # a GGUF: dequantised once, then read back from the disk cache
            checkpoint = cached_checkpoint(path, open_lazily(path))
        else:
            checkpoint = load_checkpoint(path)
        if sampler.is_alive() or sampler.ident is not None:
            sampler.join()
        torch.set_num_threads(threads[0] if threads else 1)  # before the model: its layout reads it
        model = build_model(checkpoint, device, dtype)
        num_blocks = config.num_blocks or _derive_num_blocks(model, config.block_size, device)
        return cls(
            model,
            num_blocks=num_blocks,
            block_size=config.block_size,
            max_batch_lanes=config.max_batch_lanes,
            tokenizer=tokenizer,
        )

    def add_request(
        self,
        prompt: list[int],
        params: SamplingParams,
        lanes: Iterable[LaneRequest],
        *,
        share_prefix: bool = True,
        schema: str | None = None,
    ) -> EngineRequest:
        """Queue one prompt's lanes; with `share_prefix` the prompt is prefilled once for all.

        With `schema` (JSON Schema text) every lane's output is held to it (`compile_schema`):
        each lane gets its own matcher at the schema's start."""
        limit = self.model.args.max_position
        if not prompt:
            raise ConfigError("the prompt encodes to no tokens")
        grammar = None if schema is None else self.compile_schema(schema)
        if len(prompt) >= limit:
            raise ContextLengthError(f"prompt of {len(prompt)} tokens; the model's context is {limit}")
        metrics = RequestMetrics(prompt_tokens=len(prompt))
        seqs = [
            Sequence(
                lane=lane.lane,
                tokens=list(prompt),
                num_prompt=len(prompt),
                max_tokens=max(0, min(lane.max_tokens, limit - len(prompt))),
                key=lane_key(lane.seed),
                metrics=metrics,
                params=params,
                grammar=None if grammar is None else grammar.lane(),
            )
            for lane in lanes
        ]
        needed = self.pool.blocks_for(len(prompt) + max((s.max_tokens for s in seqs), default=0))
        if needed > self.pool.num_blocks:
            raise ContextLengthError(
                f"a lane needs {needed} KV blocks but the pool has {self.pool.num_blocks}; "
                "raise num_blocks or lower max_tokens"
            )
        request = EngineRequest(seqs, metrics)
        leaders = seqs[:1] if share_prefix else seqs
        if seqs and share_prefix:
            seqs[0].followers = seqs[1:]
        for leader in leaders:
            self.scheduler.add(leader)
        self._live.append(request)
        return request

    def compile_schema(self, schema: str) -> Grammar:
        """`schema` compiled against this model's vocabulary, once per distinct text (kept in a
        bounded cache); ConfigError in one line where it does not compile or the engine has no
        tokenizer. Thread-safe: a caller may compile before it queues the request."""
        if self.grammars is None:
            raise ConfigError("schema: the engine has no tokenizer to compile it against")
        return self.grammars.compile(schema)

    def abort(self, request: EngineRequest) -> None:
        """Stop a request's lanes and give back their blocks."""
        for seq in request.sequences:
            if seq.status is not Status.FINISHED:
                self.scheduler.remove(seq)
                seq.status, seq.finish_reason = Status.FINISHED, "abort"
        if request in self._live:
            self._live.remove(request)

    def reset(self) -> list[EngineRequest]:
        """Drop every request and the prefix cache; returns the requests dropped.

        For after a failed step: blocks allocated for it were hashed but never computed.
        """
        dropped, self._live = self._live, []
        self._finished = []
        self.pool = BlockPool(self.pool.num_blocks, self.pool.block_size)
        self.scheduler = Scheduler(self.pool, self.scheduler.max_lanes)
        self._mark = None
        return dropped

    def decode_paths(self) -> DecodePaths:
        """The way the model's steps go now (`_decode_paths`): what every lane records."""
        return self.model.decode_paths()

    def has_work(self) -> bool:
        """Whether a step would compute anything."""
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Run one model step; returns the lanes that finished in it, in the order they did.

        A request whose lanes have all finished leaves the engine with its last lane.
        """
        plan = self.scheduler.schedule()
        if plan is None:
            self._mark = None
            return []
        self._mark = self._mark if self._mark is not None else self._clock()
        logits = self.runner.run(plan)  # stays on the device: only the chosen ids leave it
        holders = plan.sequences if plan.kind == "decode" else self.scheduler.running + plan.sequences
        now = self._clock()
        charge_residency(holders, self.pool, now - self._mark)
        self._mark = now
        self._account(plan)
        if plan.kind == "prefill":
            lanes, rows = self._after_prefill(plan)
            logits = logits[torch.tensor(rows, device=logits.device)]
        else:
            lanes = plan.sequences
        tokens, logprobs, alternatives = self._sample(lanes, logits)
        for seq, token, logprob, top in zip(lanes, tokens, logprobs, alternatives, strict=True):
            self._emit(seq, token, logprob, top)
        self._live = [r for r in self._live if not r.finished]
        finished, self._finished = self._finished, []
        return finished

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        lanes: Iterable[LaneRequest],
        *,
        share_prefix: bool = True,
        schema: str | None = None,
    ) -> EngineRequest:
        """Run one request to completion (with whatever else is queued)."""
        request = self.add_request(prompt, params, lanes, share_prefix=share_prefix, schema=schema)
        while not request.finished:
            self.step()
        return request

    def _account(self, plan: Step) -> None:
        m = self.metrics
        m.steps += 1
        m.prefill_steps += plan.kind == "prefill"
        m.decode_steps += plan.kind == "decode"
        m.tokens_computed += sum(len(s.tokens) - s.num_computed for s in plan.sequences)
        if plan.kind == "prefill":
            m.prompt_tokens_cached += sum(s.num_computed for s in plan.sequences)
        m.peak_kv_blocks = self.pool.peak_used
        m.cow_block_copies = self.pool.copies
        m.preemptions = self.scheduler.preemptions

    def _after_prefill(self, plan: Step) -> tuple[list[Sequence], list[int]]:
        """Fork each prefilled prompt's followers; every branch and its row of the logits."""
        lanes: list[Sequence] = []
        rows: list[int] = []
        for row, seq in enumerate(plan.sequences):
            computed = len(seq.tokens) - seq.num_computed
            if seq.num_generated == 0:
                seq.input_tokens, seq.cached_input_tokens = computed, seq.num_computed
                seq.metrics.prompt_tokens_computed += computed
                seq.metrics.prompt_tokens_cached += seq.num_computed
            else:
                seq.metrics.recomputed_tokens += computed
            seq.num_computed = len(seq.tokens)
            branches = [seq]
            for follower in seq.followers:
                follower.block_table = self.pool.fork(seq.block_table)
                follower.num_computed, follower.status = seq.num_computed, Status.RUNNING
                follower.cached_input_tokens = seq.num_prompt
                branches.append(follower)
            seq.followers = []
            self.scheduler.running.extend(branches)
            lanes += branches
            rows += [row] * len(branches)
        return lanes, rows

    @staticmethod
    def _sample(lanes: list[Sequence], logits: Tensor) -> tuple[list[int], list[float], list[Alternatives]]:
        """Every lane's next token (and log-probability, and the most likely tokens where a
        lane asked for them) in one batch on the logits' device."""
        batch = SamplingBatch.build(
            [s.params for s in lanes],
            [s.key for s in lanes],
            [s.num_generated for s in lanes],
            logits.device,
            allowed_tokens([s.grammar for s in lanes], logits.shape[1], logits.device),
        )
        none: list[Alternatives] = [()] * len(lanes)
        if not batch.top_logprobs:  # no top-k taken: a batch without alternatives pays nothing
            tokens, logprobs = sample(logits, batch)
            if logprobs is None:
                return tokens.tolist(), [0.0] * len(lanes), none
            both = torch.stack((tokens.double(), logprobs.double())).cpu()  # one copy to the host
            return [int(t) for t in both[0].tolist()], both[1].tolist(), none
        drawn, chosen, values, ids = sample_with_alternatives(logits, batch)
        rows = (
            torch.cat(
                (drawn.double()[:, None], chosen.double()[:, None], ids.double(), values.double()), dim=1
            )
            .cpu()
            .tolist()
        )  # one copy to the host
        n = ids.shape[1]
        alternatives = [tuple(zip(map(int, row[2 : 2 + n]), row[2 + n :], strict=True)) for row in rows]
        return [int(row[0]) for row in rows], [row[1] for row in rows], alternatives

    def _emit(self, seq: Sequence, token: int, logprob: float, top: Alternatives) -> None:
        """Take a lane's sampled token and finish the lane when it is done."""
        seq.num_computed = len(seq.tokens)
        if seq.num_generated >= seq.max_tokens:
            return self._finish(seq, "length")
        if token in self.eos_ids and (not seq.params.ignore_eos or seq.grammar is not None):
            return self._finish(seq, "stop")  # a grammar allows EOS only once its value is whole
        seq.tokens.append(token)
        seq.metrics.decode_tokens += 1
        if seq.params.logprobs:
            seq.logprobs.append(logprob)
            if seq.params.top_logprobs:
                seq.top_logprobs.append(top[: seq.params.top_logprobs])
        ended = seq.grammar is not None and seq.grammar.advance(token)
        if seq.params.stop and self.tokenizer is not None:
            new = seq.output.extend(self.tokenizer, seq.output_ids)
            cut = seq.output.stop_at(new, seq.params.stop)
            if cut is not None:
                return self._finish(seq, "stop", seq.output.text[:cut])
        if ended:  # nothing but end-of-sequence may follow: the value is whole
            if seq.grammar is not None and seq.grammar.error:  # a token the mask let through
                logger.warning("engine lane %d left its grammar: %s", seq.lane, seq.grammar.error)
            return self._finish(seq, "stop")
        if seq.num_generated >= seq.max_tokens:
            return self._finish(seq, "length")
        return None

    def _finish(self, seq: Sequence, reason: str, text: str | None = None) -> None:
        if text is None and self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_ids)
        seq.text = text or ""
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.scheduler.remove(seq)
        self._finished.append(seq)


def load_tokenizer(config: EngineConfig) -> Tokenizer:
    """The configured model's tokenizer alone (no weights are read)."""
    return _load_tokenizer(resolve_model_path(config.model))


def _load_tokenizer(path: Path) -> Tokenizer:
    if path.is_file():  # a GGUF: built from its metadata once, then read from the disk cache
        return cached_tokenizer(path, open_lazily(path))
    return Tokenizer.from_folder(path)


def _device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device = 'cuda' but torch sees no CUDA device")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def _dtype(choice: str, device: torch.device) -> torch.dtype:
    if choice == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[choice]


def _derive_num_blocks(model: CausalLM, block_size: int, device: torch.device) -> int:
    args = model.args
    element = model.lm_head.weight.element_size()
    block_bytes = 2 * args.num_layers * block_size * args.num_kv_heads * args.head_dim * element
    budget = (
        int(torch.cuda.mem_get_info(device)[0] * _CUDA_KV_FRACTION)
        if device.type == "cuda"
        else _CPU_KV_BYTES
    )
    return max(1, budget // block_bytes)


def default_threads(cores: int | None = None, busy: float | None = None) -> int:
    """The engine's threads where the config sets none: the cores this process may use, less
    the ones other processes keep busy now (`busy_cores`, rounded), at least one.

    torch's own default is every core. Its threads spin and wait for one another at each
    product, so a core another process holds stalls them all: on a 2-core machine with one
    core busy, an eval of 20 questions took 14.9 s on two threads against 7.5 s on one, while
    on the quiet machine two threads took 6.2 s against 7.4 (docs/engine.md#threads).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if busy is None:
        busy = busy_cores()
    return max(1, min(cores, cores - round(busy)))


def _cpu_ticks() -> tuple[float, float]:
    """The machine's CPU time so far (ticks summed over every core) and its idle part."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [float(x) for x in stat.readline().split()[1:]]
    return sum(fields[:8]), fields[3] + (fields[4] if len(fields) > 4 else 0.0)


def busy_cores(window_s: float = 0.1) -> float:
    """How many cores other processes keep busy now: the machine's CPU time over a short window
    (`/proc/stat`), less this process's own. Not the load average, which trails by a minute
    and counts this process's own work of a moment ago. 0.0 where it cannot be read."""
    try:
        total0, idle0 = _cpu_ticks()
        own0 = time.process_time()
        time.sleep(window_s)
        total1, idle1 = _cpu_ticks()
        own = time.process_time() - own0
    except (OSError, ValueError, IndexError):
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    elapsed = total1 - total0  # in ticks, summed over every core
    if elapsed <= 0:
        return 0.0
    cores = os.cpu_count() or 1
    used = (elapsed - (idle1 - idle0)) / elapsed * cores  # cores in use, ours included
    return max(0.0, used - own * ticks / (elapsed / cores))


class ThreadTuner:
    """Keeps a long-lived engine's threads at the cores other processes leave free, as the
    default picks them at load: a server started on a quiet machine would otherwise keep every
    core's thread when another job arrives, and each product would wait on the core it lost
    (2.6x slower served, docs/engine.md#threads). `retune()` is called by the driver between
    steps; every `every_s` it reads what the machine and this process used since the last look
    (no pause: the steps themselves are the window; a window the engine sat idle through is
    dropped) and sets the threads again."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._last = self._look()

    def _look(self) -> tuple[float, float, float, float] | None:
        try:
            total, idle = _cpu_ticks()
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), total, idle, time.process_time()

    def retune(self) -> int | None:
        """The threads set now, if it was time to look and they changed; else None."""
        last = self._last
        if last is None or time.monotonic() - last[0] < self.every_s:
            return None
        now = self._look()
        if now is None:
            return None
        self._last = now
        if now[0] - last[0] > 2 * self.every_s:
            return None  # the engine sat idle: that window saw others' work, not what we meet now
        elapsed = now[1] - last[1]
        if elapsed <= 0:
            return None
        machine = os.cpu_count() or 1
        wall_ticks = elapsed / machine
        used = (elapsed - (now[2] - last[2])) / wall_ticks  # cores busy, ours included
        ours = (now[3] - last[3]) * os.sysconf("SC_CLK_TCK") / wall_ticks
        threads = default_threads(self.cores, max(0.0, used - ours))
        if threads == torch.get_num_threads():
            return None
        torch.set_num_threads(threads)
        return threads
