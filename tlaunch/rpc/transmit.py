"""The transmit data server behind ``TransmitNode``, and its client.

A :class:`TransmitServer` holds named tables, each of one kind:

* ``queue``: FIFO; ``get`` consumes; ``insert`` waits while the queue holds
  ``max_size`` items (back-pressure: nothing is dropped, every item is read once);
* ``latest``: a board; ``get`` returns the newest item without consuming it and
  waits until there is one (``max_size`` does not apply);
* ``replay``: ``sample(n)`` draws ``n`` items uniformly (with replacement)
  without consuming; past ``max_size`` the oldest item goes.

The ``info`` (latest) and ``weights`` (latest) tables always exist. Blocking
calls honour their ``timeout`` (``TimeoutError``) and end with
:class:`TransmitStopped` when the program stops. The server is served over the
run's RPC (so arrays move as out-of-band buffers, without extra copies).

With a ``checkpoint_path`` the tables are saved there periodically and on stop
(atomically: written aside, fsynced, renamed) and loaded at start; a file that
does not verify (magic, length, SHA-256) raises :class:`CheckpointError`
instead of being loaded.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import CheckpointError, RemoteError, TransmitStopped

__all__ = [
    "KINDS",
    "CheckpointError",
    "Table",
    "TransmitClient",
    "TransmitServer",
    "TransmitStopped",
    "load_checkpoint",
    "save_checkpoint",
]

KINDS = ("queue", "latest", "replay")
_MAGIC = b"TLTRANS1"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload


@dataclass(frozen=True)
class Table:
    """A table of a :class:`TransmitServer`: ``Table("rollouts", "queue", max_size=1000)``."""

    name: str
    kind: str = "queue"
    max_size: int = 100_000

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"table name {self.name!r} must be a non-empty string")
        if self.kind not in KINDS:
            raise ValueError(f"table {self.name!r}: kind {self.kind!r} is not one of {list(KINDS)}")
        if not isinstance(self.max_size, int) or self.max_size < 1:
            raise ValueError(f"table {self.name!r}: max_size {self.max_size!r} must be an int >= 1")


DEFAULT_TABLES = (Table("info", "latest", 1), Table("weights", "latest", 1))


def tables_from(spec: Any) -> list[Table]:
    """Tables from a list of :class:`Table`, or a dict name -> kind (or Table), plus the defaults."""
    if spec is None:
        given: list[Table] = []
    elif isinstance(spec, dict):
        given = [v if isinstance(v, Table) else Table(k, v) for k, v in spec.items()]
    else:
        given = list(spec)
    bad = [t for t in given if not isinstance(t, Table)]
    if bad:
        raise ValueError(f"tables must be Table objects or a dict name -> kind; got {bad[0]!r}")
    names = [t.name for t in given]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"table names {dup} are given more than once")
    for default in DEFAULT_TABLES:
        mine = [t for t in given if t.name == default.name]
        if mine and mine[0].kind != "latest":
            raise ValueError(f"table {default.name!r} is reserved for the latest-value kind")
        if not mine:
            given.append(default)
    return given


class _State:
    def __init__(self, table: Table) -> None:
        self.table = table
        self.items: collections.deque[Any] = collections.deque()
        self.inserted = 0


def save_checkpoint(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically, with a verifiable header."""
    payload = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest())
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(header)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict[str, Any]:
    """The data saved at ``path``.

    Raises:
        CheckpointError: the file is not a checkpoint, is cut short, or its checksum differs.
    """
    with open(path, "rb") as f:
        raw = f.read()
    fix = f"; move {path} away to start with empty tables"
    if len(raw) < _HEADER.size:
        raise CheckpointError(f"checkpoint {path} is partial ({len(raw)} bytes, no full header){fix}")
    magic, length, digest = _HEADER.unpack_from(raw)
    payload = raw[_HEADER.size :]
    if magic != _MAGIC:
        raise CheckpointError(f"{path} is not a tlaunch transmit checkpoint (bad magic {magic!r}){fix}")
    if len(payload) != length:
        raise CheckpointError(f"checkpoint {path} is partial: {len(payload)} of {length} bytes{fix}")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not match{fix}")
    data: dict[str, Any] = pickle.loads(payload)
    return data


class TransmitServer:
    """Tables served over RPC (see the module docstring).

    Args:
        tables: the tables (see :func:`tables_from`).
        stop_event: set when the program stops; wakes every waiting call.
        checkpoint_path: where to save and load the tables (None: no checkpoints).
        checkpoint_every: seconds between periodic checkpoints.
    """

    def __init__(
        self,
        tables: Any = None,
        stop_event: threading.Event | None = None,
        checkpoint_path: str | None = None,
        checkpoint_every: float = 10.0,
    ) -> None:
        self._tables = {t.name: _State(t) for t in tables_from(tables)}
        self._cond = threading.Condition()
        self._stop = stop_event or threading.Event()
        self._path = checkpoint_path
        self._every = checkpoint_every
        self._dirty = False
        if checkpoint_path and os.path.exists(checkpoint_path):
            self._restore(load_checkpoint(checkpoint_path))
        self._saver: threading.Thread | None = None
        if checkpoint_path:
            self._saver = threading.Thread(target=self._save_loop, name="tlaunch-transmit-ckpt", daemon=True)
            self._saver.start()

    # -- served methods -------------------------------------------------
    def insert(self, table: str, item: Any, timeout: float | None = None) -> int:
        """Add ``item``; a full queue waits for room. Returns the table's size."""
        return self.insert_many(table, [item], timeout)

    def insert_many(self, table: str, items: list[Any], timeout: float | None = None) -> int:
        """Add ``items`` in order (one call for many small messages)."""
        state = self._state(table)
        with self._cond:
            for item in items:
                if state.table.kind == "queue":
                    self._wait(lambda: len(state.items) < state.table.max_size, timeout, f"room in {table!r}")
                elif state.table.kind == "latest":
                    state.items.clear()
                elif len(state.items) >= state.table.max_size:
                    state.items.popleft()
                state.items.append(item)
                state.inserted += 1
            self._dirty = True
            self._cond.notify_all()
            return len(state.items)

    def get(self, table: str, timeout: float | None = None) -> Any:
        """A queue's oldest item (consumed), or a board's newest (kept); waits for one."""
        state = self._state(table)
        if state.table.kind == "replay":
            raise ValueError(f"table {table!r} is a replay table: use sample({table!r}, n)")
        with self._cond:
            self._wait(lambda: bool(state.items), timeout, f"an item in {table!r}")
            if state.table.kind == "queue":
                self._dirty = True
                item = state.items.popleft()
                self._cond.notify_all()
                return item
            return state.items[-1]

    def get_many(self, table: str, max_items: int, timeout: float | None = None) -> list[Any]:
        """Up to ``max_items`` of a queue's oldest items (at least one; waits for it)."""
        state = self._state(table)
        if state.table.kind != "queue":
            raise ValueError(f"get_many reads queues; {table!r} is a {state.table.kind} table")
        with self._cond:
            self._wait(lambda: bool(state.items), timeout, f"an item in {table!r}")
            out = [state.items.popleft() for _ in range(min(max_items, len(state.items)))]
            self._dirty = True
            self._cond.notify_all()
            return out

    def sample(self, table: str, n: int, timeout: float | None = None) -> list[Any]:
        """``n`` items drawn uniformly with replacement, not consumed; waits for the first item."""
        state = self._state(table)
        if n < 1:
            raise ValueError(f"sample size n={n} must be >= 1")
        with self._cond:
            self._wait(lambda: bool(state.items), timeout, f"an item in {table!r}")
            import random  # here: ~1 ms of every node's start

            return random.choices(state.items, k=n)

    def size(self, table: str) -> int:
        """How many items ``table`` holds."""
        state = self._state(table)
        with self._cond:
            return len(state.items)

    def tables(self) -> dict[str, dict[str, Any]]:
        """Every table's kind, max_size, size and total inserted."""
        with self._cond:
            return {
                n: {
                    "kind": s.table.kind,
                    "max_size": s.table.max_size,
                    "size": len(s.items),
                    "inserted": s.inserted,
                }
                for n, s in self._tables.items()
            }

    def checkpoint(self) -> str | None:
        """Save the tables now; returns the path (None without a checkpoint_path)."""
        if not self._path:
            return None
        with self._cond:
            data = {
                n: {"table": s.table, "items": list(s.items), "inserted": s.inserted}
                for n, s in self._tables.items()
            }
            self._dirty = False
        save_checkpoint(self._path, data)
        return self._path

    # -- lifecycle ------------------------------------------------------
    def close(self) -> None:
        """Wake every waiting call and save a last checkpoint."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._path:
            self.checkpoint()

    def _save_loop(self) -> None:
        while not self._stop.wait(self._every):
            if self._dirty:
                self.checkpoint()

    def _restore(self, data: dict[str, Any]) -> None:
        for name, saved in data.items():
            state = self._tables.get(name)
            if state is None:
                self._tables[name] = state = _State(saved["table"])
            state.items.extend(saved["items"])
            state.inserted = saved["inserted"]

    def _state(self, table: str) -> _State:
        state = self._tables.get(table)
        if state is None:
            raise KeyError(f"no table {table!r}; tables: {sorted(self._tables)}")
        return state

    def _wait(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if self._stop.is_set():
                raise TransmitStopped(f"the program stopped while waiting for {what}")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no {what} within {timeout} s")
            self._cond.wait(0.5 if left is None else min(left, 0.5))


class _Torch:
    """A torch tensor on the wire: its numpy view (zero-copy both ways on CPU)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple[object, ...]:
        return (_Torch, (self.array,))


def _walk(fn: Callable[[Any], Any], obj: Any) -> Any:
    """``fn`` on every leaf of nested dicts, lists and tuples."""
    if isinstance(obj, dict):
        return {k: _walk(fn, v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(fn, v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_walk(fn, v) for v in obj)
    return fn(obj)


def _to_wire(obj: Any) -> Any:
    def leaf(x: Any) -> Any:
        if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
            return _Torch(x.detach().cpu().numpy())
        return x

    return _walk(leaf, obj)


def _from_wire(obj: Any) -> Any:
    def leaf(x: Any) -> Any:
        if isinstance(x, _Torch):
            import torch

            return torch.from_numpy(x.array)
        return x

    return _walk(leaf, obj)


class TransmitClient:
    """The client a ``TransmitNode`` handle dereferences to (see the module docstring)."""

    def __init__(self, rpc: Any) -> None:
        self._rpc = rpc

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        try:
            # The server enforces ``timeout``; the reply gets a little longer to arrive.
            return self._rpc.call(method, (*args, timeout), timeout=None if timeout is None else timeout + 30)
        except RemoteError as exc:
            if exc.type_name.endswith("TimeoutError"):
                raise TimeoutError(exc.remote_message) from None
            if exc.type_name.endswith("TransmitStopped"):
                raise TransmitStopped(exc.remote_message) from None
            if exc.type_name in ("KeyError", "ValueError", "builtins.KeyError", "builtins.ValueError"):
                raise (KeyError if "KeyError" in exc.type_name else ValueError)(exc.remote_message) from None
            raise

    def insert(self, table: str, obj: Any, timeout: float | None = None) -> int:
        """Add ``obj`` to ``table`` (a full queue waits up to ``timeout``)."""
        return int(self._call("insert", table, _to_wire(obj), timeout=timeout))

    def insert_many(self, table: str, objs: list[Any], timeout: float | None = None) -> int:
        """Add ``objs`` in one call."""
        return int(self._call("insert_many", table, [_to_wire(o) for o in objs], timeout=timeout))

    def get(self, table: str, timeout: float | None = None) -> Any:
        """The next item of a queue (consumed) or the newest of a board; waits up to ``timeout``."""
        return _from_wire(self._call("get", table, timeout=timeout))

    def get_many(self, table: str, max_items: int, timeout: float | None = None) -> list[Any]:
        """Up to ``max_items`` items of a queue, at least one."""
        return [_from_wire(x) for x in self._call("get_many", table, max_items, timeout=timeout)]

    def sample(self, table: str, n: int, timeout: float | None = None) -> list[Any]:
        """``n`` items of a replay table, uniformly, not consumed."""
        return [_from_wire(x) for x in self._call("sample", table, n, timeout=timeout)]

    def size(self, table: str) -> int:
        """How many items ``table`` holds."""
        return int(self._rpc.call("size", (table,)))

    def tables(self) -> dict[str, dict[str, Any]]:
        """Every table's kind, max_size, size and total inserted."""
        result: dict[str, dict[str, Any]] = self._rpc.call("tables")
        return result

    def send_info(self, obj: Any) -> None:
        """Post ``obj`` on the ``info`` board."""
        self.insert("info", obj)

    def get_info(self, timeout: float | None = None) -> Any:
        """The newest ``info`` (waits for the first)."""
        return self.get("info", timeout)

    def insert_weight(self, state: Any) -> None:
        """Publish model weights (nested dicts of numpy arrays or torch tensors)."""
        self.insert("weights", state)

    def get_weight(self, timeout: float | None = None) -> Any:
        """The newest weights (waits for the first)."""
        return self.get("weights", timeout)

    def checkpoint(self) -> str | None:
        """Ask the server to save its tables now."""
        result: str | None = self._rpc.call("checkpoint")
        return result

    def __repr__(self) -> str:
        return f"TransmitClient({self._rpc!r})"
