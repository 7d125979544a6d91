"""``batched_handler``: many concurrent calls of a served method, run as one batched call.

Launchpad's ``lp.batched_handler(batch_size)``, for centralised inference: up
to ``batch_size`` calls that arrive together are merged (numpy arrays stacked
along a new first axis, dicts and tuples batched per entry, anything else put
in a list), the wrapped function runs once on the batch, and each caller gets
its own row of the result. A batch runs when it is full, or ``timeout`` after
its first call arrived.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

__all__ = ["batched_handler"]


def _batch(values: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        return {k: _batch([v[k] for v in values]) for k in first}
    if isinstance(first, tuple) and not hasattr(first, "_fields"):
        return tuple(_batch([v[i] for v in values]) for i in range(len(first)))
    np = _numpy()
    if np is not None and isinstance(first, np.ndarray):
        return np.stack(values)
    return list(values)


def _unbatch(result: Any, i: int) -> Any:
    if isinstance(result, dict):
        return {k: _unbatch(v, i) for k, v in result.items()}
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return tuple(_unbatch(v, i) for v in result)
    return result[i]


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")  # arrays can only come from a numpy already imported


class _Batcher:
    """Collects calls into batches and runs them (see the module docstring)."""

    def __init__(
        self, func: Callable[..., Any], batch_size: int, max_parallelism: int, timeout: float, pad_batch: bool
    ) -> None:
        self.func = func
        self.batch_size = batch_size
        self.timeout = timeout
        self.pad_batch = pad_batch
        self.slots = threading.BoundedSemaphore(max_parallelism)
        self.lock = threading.Lock()
        self.pending: list[tuple[tuple[Any, ...], dict[str, Any], Future[Any]]] = []
        self.timer: threading.Timer | None = None

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        future: Future[Any] = Future()
        with self.lock:
            self.pending.append((args, kwargs, future))
            if len(self.pending) >= self.batch_size:
                batch = self._take()
            else:
                batch = None
                if self.timer is None:
                    self.timer = threading.Timer(self.timeout, self._on_timeout)
                    self.timer.daemon = True
                    self.timer.start()
        if batch is not None:
            self._run(batch)
        return future.result()

    def _take(self) -> list[tuple[tuple[Any, ...], dict[str, Any], Future[Any]]]:
        batch, self.pending = self.pending[: self.batch_size], self.pending[self.batch_size :]
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return batch

    def _on_timeout(self) -> None:
        with self.lock:
            self.timer = None
            batch = self._take() if self.pending else []
        if batch:
            self._run(batch)

    def _run(self, batch: list[tuple[tuple[Any, ...], dict[str, Any], Future[Any]]]) -> None:
        calls = list(batch)
        if self.pad_batch:  # repeat the last call: every batch has batch_size rows
            calls += [calls[-1]] * (self.batch_size - len(calls))
        with self.slots:
            try:
                n_args = len(calls[0][0])
                args = [_batch([c[0][i] for c in calls]) for i in range(n_args)]
                kwargs = {k: _batch([c[1][k] for c in calls]) for k in calls[0][1]}
                result = self.func(*args, **kwargs)
            except BaseException as exc:
                for _, _, future in batch:
                    future.set_exception(exc)
                return
        for i, (_, _, future) in enumerate(batch):
            try:
                future.set_result(_unbatch(result, i))
            except BaseException as exc:
                future.set_exception(exc)


def batched_handler(
    batch_size: int,
    max_parallelism: int = 1,
    timeout: datetime.timedelta = datetime.timedelta(milliseconds=200),
    pad_batch: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Batch concurrent calls of a served method (see the module docstring).

    Wrap a bound method in the constructor, not the class's method::

        def __init__(self, batch_size):
            self.compute = lp.batched_handler(batch_size=batch_size)(self.compute)

    Args:
        batch_size: how many calls to batch together, at most.
        max_parallelism: how many batches may run at once.
        timeout: how long a batch waits for more calls after its first.
        pad_batch: pad a batch that timed out to ``batch_size`` (the extra rows are dropped).
    """
    if batch_size < 1 or max_parallelism < 1:
        raise ValueError(f"batch_size={batch_size} and max_parallelism={max_parallelism} must be >= 1")

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(func).parameters)
        if params and params[0] == "self" and not hasattr(func, "__self__"):
            raise TypeError(
                "Do not decorate class methods with batched_handler: wrap the bound method in the "
                "object's constructor instead (self.f = batched_handler(n)(self.f))"
            )
        batcher = _Batcher(func, batch_size, max_parallelism, timeout.total_seconds(), pad_batch)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return batcher.call(args, kwargs)

        return wrapper

    return decorate
