"""Encoding tensors on several processes, results in submission order
(`colibri convert --jobs N`).

The block quantisers (colibri/file/kquants.py) are numpy sweeps over
candidate scales that run on one core: on a 2-core AMD EPYC Zen 3 the Q4_K
search takes about 8.5 million weights a second, so the q4 mix of a
6.8 B-parameter MoE takes some 13 minutes on one core. Tensors are
independent, so a converter hands each one to a worker process and writes
the results in the file's order as they come back; every byte is the one a
single process writes (storage.encode is a pure function of its
arguments).

EncodePool(jobs) is a context manager: submit(weights, dtype, group_size,
importance) returns a handle whose result() is storage.encode's
(values, scales), or raises what encode raised (a ColibriError about that
tensor). Only a block type's tensor of at least POOL_MIN_WEIGHTS weights
goes to a worker; the rest are encoded when submitted, in this process:
int8 and int16 take a few passes over the weights, less than handing them
over costs (bench's small model to int8: 8.0 s in one process, 14.6 s with
two workers), and a small tensor's search is shorter than a worker's
start. With jobs == 1, or when nothing qualifies, no worker is started.
Workers are spawned, not forked (a fork of a
process in which OpenBLAS or torch has started threads can deadlock on a
lock one of them held), and import only numpy and colibri.file.

InOrder(pool, write, name) is a converter's export loop over such a pool:
tensors submitted to it are written by write(tag, (values, scales)) in
submission order, and at most jobs + 1 are held at once (one queued behind
each busy worker). A worker that dies (killed for memory, say) makes
result() raise concurrent.futures.process.BrokenProcessPool; InOrder turns
that, and a tensor that cannot be encoded or written, into one-line
ConversionErrors naming the tensor (name(tag)).

Memory: a tensor in flight is pickled to its worker, so it is held twice
(source and worker copy) plus its encoded form; InOrder keeps jobs + 1 in
flight.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import numpy as np

from ..errors import ColibriError, ConversionError
from . import blocks, storage

# A block type's tensor of fewer weights is encoded in the calling process
# (a 1024 x 1024 Q6_K search takes about 0.1 s, a worker's start as long).
POOL_MIN_WEIGHTS = 1 << 20


def default_jobs() -> int:
    """The cores this process may run on (sched_getaffinity where it
    exists: a container's or taskset's limit, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def checked_jobs(jobs) -> int:
    """A converter's `jobs` argument, or the ConversionError that says what
    it must be."""
    if not isinstance(jobs, int) or jobs < 1:
        raise ConversionError(f"jobs = {jobs!r}: the worker processes that encode "
                              "tensors, 1 or more")
    return jobs


def _done(fn, *args) -> cf.Future:
    """fn(*args) computed now, in this process, as a finished Future: its
    result() returns the value or raises what fn raised."""
    fut: cf.Future = cf.Future()
    try:
        fut.set_result(fn(*args))
    except Exception as exc:  # re-raised by result(), as a worker's would be
        fut.set_exception(exc)
    return fut


class EncodePool:
    """Up to `jobs` worker processes, started when the first tensor needs
    one and joined at exit (on an error, with what was queued cancelled)."""

    def __init__(self, jobs: int = 1):
        if jobs < 1:
            raise ValueError(f"jobs = {jobs}: at least 1")
        self.jobs = jobs
        self._pool: cf.ProcessPoolExecutor | None = None

    def __enter__(self) -> "EncodePool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            # on an error nothing submitted is wanted any more
            pool.shutdown(wait=True, cancel_futures=exc_type is not None)

    def submit(self, weights: np.ndarray, dtype: int, group_size: int,
               importance: np.ndarray | None = None):
        """storage.encode(weights, dtype, group_size, importance), on a worker
        if the tensor qualifies: a handle whose result() is (values, scales)."""
        if (self.jobs == 1 or not blocks.is_block(dtype)
                or np.size(weights) < POOL_MIN_WEIGHTS):
            return _done(storage.encode, weights, dtype, group_size, importance)
        if self._pool is None:   # started at the first tensor that needs it
            try:
                self._pool = cf.ProcessPoolExecutor(
                    max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"))
            except (OSError, NotImplementedError):
                # no process-shared semaphores (a container without
                # /dev/shm): the same bytes, in this process
                self.jobs = 1
                return _done(storage.encode, weights, dtype, group_size, importance)
        return self._pool.submit(storage.encode, weights, int(dtype), group_size, importance)


class InOrder:
    """Tensors encoded on `pool` and written in the order they were given:
    write(tag, (values, scales)) for each, at most pool.jobs + 1 held at
    once (every worker busy and one queued behind them). name(tag) is the
    tensor's name for the errors:
    - an encoding or writing error (ColibriError) becomes
      ConversionError("tensor NAME: ...");
    - a worker that died becomes a ConversionError naming the first tensor
      not written: every queued tensor fails with the pool, and a new one
      cannot be submitted, so the culprit can be any of them.
    Call finish() after the last tensor: it writes the ones still queued."""

    def __init__(self, pool: EncodePool, write: Callable[[Any, tuple], None],
                 name: Callable[[Any], str]):
        self.pool = pool
        self._write, self._name = write, name
        self._pending: deque = deque()          # (tag, handle), oldest first

    def submit(self, tag, weights: np.ndarray, dtype: int, group_size: int,
               importance: np.ndarray | None = None) -> None:
        """storage.encode(weights, ...) on the pool, then write(tag, ...)."""
        try:
            handle = self.pool.submit(weights, dtype, group_size, importance)
        except BrokenProcessPool as exc:   # a worker stopped before this
            raise self._stopped(self._pending[0][0] if self._pending else tag) from exc
        self._add(tag, handle)

    def encoded(self, tag, values: np.ndarray, scales: np.ndarray | None) -> None:
        """A tensor the caller encoded itself (a GGUF block copied as it is),
        written in its turn."""
        self._add(tag, _done(lambda: (values, scales)))

    def finish(self) -> None:
        while self._pending:
            self._write_oldest()

    def _add(self, tag, handle) -> None:
        self._pending.append((tag, handle))
        while len(self._pending) > self.pool.jobs:
            self._write_oldest()

    def _write_oldest(self) -> None:
        tag, handle = self._pending.popleft()
        try:
            self._write(tag, handle.result())
        except BrokenProcessPool as exc:
            raise self._stopped(tag) from exc
        except ConversionError:
            raise
        except ColibriError as exc:
            raise ConversionError(f"tensor {self._name(tag)!r}: {exc}") from exc

    def _stopped(self, first) -> ConversionError:
        return ConversionError(
            f"a worker process stopped (killed for memory?) while tensors from "
            f"{self._name(first)!r} on were being encoded: convert with fewer --jobs, "
            "or --jobs 1")
