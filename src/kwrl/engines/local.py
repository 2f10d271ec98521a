"""The in-process engine: one worker thread batches every waiting request into one decode loop.

Rollouts must be batched (FACTS.md: HF `generate` at batch 1 spends ~4.5 ms of Python per token),
and many agent trials await `generate` concurrently. So `generate` only enqueues its request and
awaits a future; a single worker thread takes whatever requests are waiting (after a short
`batch_window_s`, so that requests submitted together land in the same batch), prefills them
together, and decodes them step by step with a KV cache (`decoders.py`). A sequence ends on one
of its stop tokens (returned, since it is trained) or at its `max_tokens`; its future resolves at
that step, not at the end of the batch, and finished rows are dropped from the batch once half of
it has finished. Requests that arrive while a batch runs wait for the next one (no joining
mid-batch). Running the model in a thread leaves the event loop free for tools and HTTP.

Sampling (`sampling.py`) is per request: temperature, top_p and a `torch.Generator` seeded from
the request's seed, so a request's tokens depend on (seed, prompt, weights) and not on what else
shares its batch. Padding can move logits by float rounding (measured: <= 1e-6 in fp32 on the
tiny model), which could flip a sampled token only at a near-exact tie.

Weights and versions: `update_weights` takes the engine's lock, which the worker holds for a
whole batch, so weights change only between batches; it bumps `policy_version`, and every
Completion carries the version its batch was sampled with. The engine owns the model it is given
(it may move it to `device` and it reads the parameters in place); to train the same model in
the same process, give the engine a copy and call `update_weights` after each step.

Failures are values for the caller, never hangs: an exception in the worker fails the requests
of that batch with EngineError and the worker goes on with the next batch; every await is bounded
by `request_timeout_s`; `close()` finishes a batch in flight with finish_reason "abort" and fails
queued requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from kwrl.engines.base import Completion, EngineError, SamplingParams
from kwrl.engines.decoders import BatchDecoder, make_decoder
from kwrl.engines.sampling import (
    GREEDY_TEMPERATURE,
    processed_logprobs,
    request_uniforms,
    sample,
)
from kwrl.models.load import default_dtype


@dataclass
class EngineStats:
    """Counters since the engine started (read them for tests, benchmarks and metrics)."""

    batches: int = 0
    requests: int = 0
    decode_steps: int = 0
    """Sampling steps, one per batch per generated position (the prefill's included)."""
    generated_tokens: int = 0
    max_batch_size: int = 0
    failed_batches: int = 0
    prefill_seconds: float = 0.0
    """Wall time spent prefilling batches (the rest of `busy_seconds` is decoding)."""
    busy_seconds: float = 0.0
    """Wall time the worker spent running batches."""


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: concurrent.futures.Future[Completion] = field(default_factory=concurrent.futures.Future)


class _Batch:
    """The per-row sampling state of one batch, kept in the decoder's current row order."""

    def __init__(self, requests: list[_Request], device: torch.device) -> None:
        params = [r.params for r in requests]
        self.requests = requests
        self.max_new = max(p.max_tokens for p in params)
        self.request_B = torch.arange(len(requests), device=device)
        self.alive_B = torch.ones(len(requests), dtype=torch.bool, device=device)
        self.temperature_B = torch.tensor([p.temperature for p in params], device=device)
        self.top_p_B = torch.tensor([p.top_p for p in params], device=device)
        self.greedy_B = self.temperature_B < GREEDY_TEMPERATURE
        self.any_greedy = bool(self.greedy_B.any())
        self.scale = any(p.temperature != 1.0 for p in params)
        self.filter_top_p = any(p.top_p < 1.0 for p in params)
        self.max_tokens_B = torch.tensor([p.max_tokens for p in params], device=device)
        self.min_max_tokens = min(p.max_tokens for p in params)
        stops = [sorted(set(p.stop_token_ids)) for p in params]
        width = max(1, *(len(s) for s in stops))
        self.stop_B_S = torch.tensor([s + [-1] * (width - len(s)) for s in stops], device=device)
        # step-major, so that a step's row of each is a view while no row has been dropped
        uniform_N_R = torch.zeros((self.max_new, len(requests)), dtype=torch.float64)
        for index, request in enumerate(requests):
            uniform_N_R[: request.params.max_tokens, index] = request_uniforms(
                request.seed, request.params.max_tokens)
        self.uniform_N_R = uniform_N_R.to(device)
        self.tokens_N_R = torch.zeros((self.max_new, len(requests)), dtype=torch.long,
                                      device=device)
        self.logprobs_N_R = torch.zeros((self.max_new, len(requests)), device=device)
        self.all_rows = True  # row b is still request b (no row dropped yet)

    def sample(self, step: int, logits_B_V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one token per row, record it, and return (token_B, done_B) for alive rows."""
        logprobs_B_V = processed_logprobs(logits_B_V, self.temperature_B, self.top_p_B,
                                          scale=self.scale, filter_top_p=self.filter_top_p)
        uniform_B = self.uniform_N_R[step]
        if not self.all_rows:
            uniform_B = uniform_B.index_select(0, self.request_B)
        token_B, logprob_B = sample(logprobs_B_V, uniform_B,
                                    self.greedy_B if self.any_greedy else None)
        if self.all_rows:
            self.tokens_N_R[step] = token_B
            self.logprobs_N_R[step] = logprob_B
        else:
            self.tokens_N_R[step].index_copy_(0, self.request_B, token_B)
            self.logprobs_N_R[step].index_copy_(0, self.request_B, logprob_B)
        done_B = (token_B.unsqueeze(1) == self.stop_B_S).any(dim=1)
        if step + 1 >= self.min_max_tokens:
            done_B |= self.max_tokens_B <= step + 1
        return token_B, done_B.logical_and_(self.alive_B)

    def keep(self, rows_B: torch.Tensor) -> None:
        self.all_rows = False
        for name in ("request_B", "alive_B", "temperature_B", "top_p_B", "greedy_B",
                     "max_tokens_B", "stop_B_S"):
            setattr(self, name, getattr(self, name).index_select(0, rows_B))

    def completion(self, row: int, length: int, version: int, aborted: bool) -> Completion:
        index = int(self.request_B[row])
        tokens = self.tokens_N_R[:length, index].tolist()
        stops = self.requests[index].params.stop_token_ids
        reason = "abort" if aborted else "stop" if tokens and tokens[-1] in stops else "length"
        return Completion(tuple(tokens), tuple(self.logprobs_N_R[:length, index].tolist()),
                          reason, version)


class LocalEngine:
    """The Engine protocol over an in-process torch model (see the module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        max_batch: int = 64,
        device: torch.device | str | None = None,
        seed: int = 0,
        decoder: BatchDecoder | None = None,
        batch_window_s: float = 0.002,
        request_timeout_s: float = 600.0,
        num_threads: int | None = 1,
    ) -> None:
        """`device`: move the model there (fp32 on CPU, bf16 on CUDA); None keeps it where it
        is. `seed` seeds the seeds of requests that bring none. `decoder` defaults to
        `make_decoder(model)` (tests pass their own). `num_threads`: torch intra-op threads of
        the worker thread only (OpenMP and MKL settings are per thread); None leaves torch's
        default. One is the default because a decode step of a small model is dozens of tiny
        ops: on 2 shared cores, two OpenMP threads per op measured 2-10x slower than one."""
        if device is not None:
            device = torch.device(device)
            model.to(device=device, dtype=default_dtype(device))
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self.request_timeout_s = request_timeout_s
        self.num_threads = num_threads
        self.stats = EngineStats()
        self._decoder = decoder if decoder is not None else make_decoder(model)
        self._seeds = random.Random(seed)
        self._version = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="kwrl-local-engine", daemon=True)
        self._worker.start()

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        future = self.submit(prompt_ids, params)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.request_timeout_s)
        except TimeoutError as exc:
            raise EngineError(f"no completion within {self.request_timeout_s} s") from exc

    def submit(self, prompt_ids: list[int], params: SamplingParams
               ) -> concurrent.futures.Future[Completion]:
        """Enqueue one request (thread-safe, no event loop needed); its future resolves to the
        Completion or fails with EngineError."""
        self._check(prompt_ids, params)
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        request = _Request(list(prompt_ids), params, seed)
        if params.max_tokens == 0:
            request.future.set_result(Completion((), (), "length", self._version))
            return request.future
        self._queue.put(request)
        if self._closed:  # close() may have drained the queue just before the put
            _fail(request.future, EngineError("the engine is closed"))
        return request.future

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None
                       ) -> int:
        """Copy `state_dict` (all or some of the model's tensors) into the model between
        batches; returns the new policy version: `version` when given (a resumed run restores
        its own; versions never go back), else the current one plus one. Unknown names or
        shapes change nothing."""
        if version is not None and version < self._version:
            raise ValueError(f"policy version {version} is older than the engine's "
                             f"{self._version}")
        current = self.model.state_dict()
        unknown = sorted(set(state_dict) - set(current))
        wrong = sorted(k for k, v in state_dict.items()
                       if k in current and tuple(v.shape) != tuple(current[k].shape))
        if unknown or wrong:
            raise ValueError(f"weights do not fit the model: unknown {unknown[:5]}, "
                             f"wrong shape {wrong[:5]}")
        with self._lock, torch.no_grad():
            self.model.load_state_dict(dict(state_dict), strict=False)
            self._decoder.refresh()
            self._version = self._version + 1 if version is None else version
            return self._version

    def load_weights(self, path: Path | str) -> int:
        """`update_weights` from a safetensors file or a checkpoint directory of them."""
        return self.update_weights(read_safetensors(Path(path)))

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the worker: the batch in flight ends with "abort", queued requests fail."""
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout_s)
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            if request is not None:
                _fail(request.future, EngineError("the engine is closed"))

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if self._closed:
            raise EngineError("the engine is closed")
        if not prompt_ids:
            raise EngineError("the prompt is empty")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise EngineError(f"prompt ids must lie in [0, {self.vocab_size})")
        if params.max_tokens < 0 or params.temperature < 0 or not 0 < params.top_p <= 1:
            raise EngineError(f"invalid sampling parameters {params}")

    def _work(self) -> None:
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        with torch.inference_mode():
            while (requests := self._next_batch()) is not None:
                live = [r for r in requests if r.future.set_running_or_notify_cancel()]
                if live:
                    with self._lock:
                        self._run_batch(live)

    def _next_batch(self) -> list[_Request] | None:
        """Block for one request, then gather more for `batch_window_s`; None means stop."""
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.batch_window_s
        while len(batch) < self.max_batch:
            try:
                request = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if request is None:
                self._queue.put(None)  # stop after this batch
                break
            batch.append(request)
        return batch

    def _run_batch(self, requests: list[_Request]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.requests += len(requests)
        stats.max_batch_size = max(stats.max_batch_size, len(requests))
        started = time.perf_counter()
        try:
            self._decode(requests, self._version)
        except Exception as exc:  # the worker must survive: fail this batch, serve the next
            stats.failed_batches += 1
            error = EngineError(f"local engine failed: {type(exc).__name__}: {exc}")
            for request in requests:
                _fail(request.future, error)
        finally:
            stats.busy_seconds += time.perf_counter() - started

    def _decode(self, requests: list[_Request], version: int) -> None:
        started = time.perf_counter()
        batch = _Batch(requests, self.device)
        logits_B_V = self._decoder.start([r.prompt_ids for r in requests], batch.max_new)
        self.stats.prefill_seconds += time.perf_counter() - started
        alive = len(requests)
        for step in range(batch.max_new):
            token_B, done_B = batch.sample(step, logits_B_V)
            self.stats.decode_steps += 1
            self.stats.generated_tokens += alive
            if self._closed:
                done_B = batch.alive_B.clone()
            if bool(done_B.any()):
                for row in done_B.nonzero().flatten().tolist():
                    completion = batch.completion(row, step + 1, version, self._closed)
                    _resolve(batch.requests[int(batch.request_B[row])].future, completion)
                batch.alive_B &= ~done_B
                alive = int(batch.alive_B.sum())
                if alive == 0:
                    return
                if alive <= len(batch.alive_B) // 2:  # shrink when half the rows are done
                    rows_B = batch.alive_B.nonzero().flatten()
                    batch.keep(rows_B)
                    self._decoder.keep(rows_B)
                    token_B = token_B.index_select(0, rows_B)
            logits_B_V = self._decoder.step(token_B)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, or of every `*.safetensors` file in a directory."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no safetensors weights at {path}")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def _resolve(future: concurrent.futures.Future[Completion], completion: Completion) -> None:
    try:
        future.set_result(completion)
    except concurrent.futures.InvalidStateError:
        pass  # the caller gave up (cancelled or timed out); nobody is waiting


def _fail(future: concurrent.futures.Future[Completion], error: EngineError) -> None:
    try:
        future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass  # already resolved or cancelled by the caller
