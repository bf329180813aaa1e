"""Encoding tensors on several processes, results in submission order
(`colibri convert --jobs N`).

The block quantisers (colibri/file/kquants.py) are numpy sweeps over
candidate scales that run on one core: on a 2-core AMD EPYC Zen 3 the Q4_K
search takes about 4.4 million weights a second, so the q4 mix of a
6.8 B-parameter MoE takes some 25 minutes on one core. Tensors are
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

A worker that dies (killed for memory, say) makes result() raise
concurrent.futures.process.BrokenProcessPool; the converter turns that into
its one-line error.

Memory: the caller bounds the tensors in flight (colibri/model/convert.py
keeps at most jobs + 1 submitted and unwritten); each is pickled to its
worker, so a tensor in flight is held twice (source and worker copy) plus
its encoded form.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os

import numpy as np

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
