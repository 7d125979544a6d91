"""What a pool is made of, and what a job asks of it: frozen values, no I/O.

A :class:`Host` is what the server knows of one SSH host (probed, or declared
in ``pool.yaml``): its CPU ids, memory, GPUs by index and UUID, labels, the
processes it saw on its GPUs, and whether it answers. A :class:`Request` is
what one job asks: ``trainers`` hosts, each with ``gpus``, ``cpus`` and
``memory``. A :class:`Placement` is the answer: one :class:`Slot` per trainer,
in rank order, naming the very GPU indices and CPU ids it gets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Gpu",
    "GpuProcess",
    "Host",
    "HostFacts",
    "Placement",
    "Request",
    "Slot",
    "cpu_list",
    "format_cpus",
    "format_memory",
    "parse_cpu_list",
    "parse_memory",
]

_UNITS = {
    "": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
}  # fmt: skip
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_memory(value: object) -> int:
    """Bytes of a memory quantity: an int (bytes), or ``16Gi``, ``512G``, ``1.5Ti``, ``800Mi``.

    Raises:
        ValueError: not a quantity (the message says what is).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory quantity (e.g. 16Gi, 512G, or bytes)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} bytes: memory cannot be negative")
        return value
    found = _QUANTITY.match(str(value)) if isinstance(value, str) else None
    unit = found.group(2) if found else None
    if found is None or unit not in _UNITS:
        raise ValueError(
            f"{value!r} is not a memory quantity: give bytes, or a number with Ki, Mi, Gi, Ti "
            "(powers of 1024) or k, M, G, T (powers of 1000), e.g. 16Gi"
        )
    return math.ceil(float(found.group(1)) * _UNITS[unit])


def format_memory(size: int) -> str:
    """``size`` bytes for people: ``7.6Gi``, ``512Mi``, ``0``."""
    for unit in ("Ti", "Gi", "Mi", "Ki"):
        if size >= _UNITS[unit]:
            text = f"{size / _UNITS[unit]:.1f}".removesuffix(".0")
            return f"{text}{unit}"
    return str(size)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """CPU ids of a Linux CPU list (``0-3,8,10-11``, as ``/proc/self/status`` and ``taskset`` write it).

    Raises:
        ValueError: not a CPU list.
    """
    ids: list[int] = []
    for part in text.strip().split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{text!r} is not a CPU list (e.g. 0-3,8,10-11)")
        ids.extend(range(int(first), int(last if dash else first) + 1))
    return tuple(sorted(set(ids)))


def format_cpus(ids: Iterable[int]) -> str:
    """CPU ids as a Linux CPU list: ``(0, 1, 2, 5)`` -> ``0-2,5`` (what ``taskset -c`` takes)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cpu_list(count: int) -> tuple[int, ...]:
    """CPU ids ``0..count-1`` (a host declared with ``cpus: N``)."""
    return tuple(range(count))


@dataclass(frozen=True)
class Gpu:
    """One GPU of a host.

    Attributes:
        index: its index as ``nvidia-smi`` numbers it (PCI bus order).
        uuid: ``GPU-...`` (None for a GPU declared by hand: it is then named by index).
        name: its model (``NVIDIA A100-SXM4-80GB``); a job's GPU label may match a word of it.
        memory_mib: its memory.
    """

    index: int
    uuid: str | None = None
    name: str = ""
    memory_mib: int = 0

    @property
    def words(self) -> frozenset[str]:
        """The words of its model, lower case (``a100``, ``sxm4``, ``80gb``): what a label matches."""
        return frozenset(w for w in re.split(r"[^a-z0-9]+", self.name.lower()) if w)


@dataclass(frozen=True)
class GpuProcess:
    """A process that uses a GPU (``nvidia-smi --query-compute-apps``)."""

    gpu_uuid: str
    pid: int
    name: str = ""
    used_mib: int = 0


@dataclass(frozen=True)
class HostFacts:
    """What a probe found on a host: its CPU ids, memory, GPUs and the processes on them."""

    cpus: tuple[int, ...]
    memory: int
    gpus: tuple[Gpu, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Host:
    """One host of the pool, as the server knows it now.

    Attributes:
        name: its name as the ssh config knows it.
        cpus: the CPU ids jobs may be given.
        memory: bytes jobs may be given.
        gpus: its GPUs, by index.
        labels: words a job's ``gpu_label`` may ask for (``a100``); a GPU's model words count too.
        pool: the named pool it belongs to.
        up: it answered its last probe.
        reason: why it is down (its last probe's error), or None.
        gpu_processes: the processes its last probe saw on its GPUs (a GPU with one that
            no job of the server holds is someone else's: never handed out).
        known: its resources are known (probed once, or declared): a host never seen
            counts for nothing, not even for "does this job ever fit".
    """

    name: str
    cpus: tuple[int, ...] = ()
    memory: int = 0
    gpus: tuple[Gpu, ...] = ()
    labels: frozenset[str] = frozenset()
    pool: str = "default"
    up: bool = True
    reason: str | None = None
    gpu_processes: tuple[GpuProcess, ...] = ()
    known: bool = True

    def gpu(self, index: int) -> Gpu:
        """Its GPU of index ``index``."""
        return next(g for g in self.gpus if g.index == index)

    def has_label(self, label: str | None) -> bool:
        """Whether a job asking for ``label`` (None: any) may run here."""
        if label is None:
            return True
        word = label.lower()
        return word in {x.lower() for x in self.labels} or any(word in g.words for g in self.gpus)

    def busy_gpus(self) -> dict[int, tuple[GpuProcess, ...]]:
        """Its GPUs (by index) on which its last probe saw a process, and those processes."""
        by_uuid: dict[str, list[GpuProcess]] = {}
        for proc in self.gpu_processes:
            by_uuid.setdefault(proc.gpu_uuid, []).append(proc)
        return {g.index: tuple(by_uuid[g.uuid]) for g in self.gpus if g.uuid in by_uuid}

    def visible_devices(self, indices: Sequence[int]) -> str:
        """``CUDA_VISIBLE_DEVICES`` for these GPUs: their UUIDs when known, else their indices."""
        gpus = [self.gpu(i) for i in indices]
        return ",".join(g.uuid if g.uuid else str(g.index) for g in gpus)


@dataclass(frozen=True)
class Request:
    """What one job asks of the pool: ``trainers`` distinct hosts, each with this much.

    Attributes:
        trainers: how many trainers (``num_trainer``, torchrun's ``nnodes``): one host each.
        gpus: GPUs of each trainer, all on its host.
        cpus: CPUs of each trainer (its CPU set).
        memory: bytes of each trainer.
        label: a host label or GPU model word every trainer's host must have (``a100``).
        pool: the named pool it runs in (None: any).
    """

    trainers: int = 1
    gpus: int = 0
    cpus: int = 1
    memory: int = 0
    label: str | None = None
    pool: str | None = None

    def __post_init__(self) -> None:
        for name in ("trainers", "gpus", "cpus", "memory"):
            value = getattr(self, name)
            low = 1 if name == "trainers" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be a whole number >= {low}")

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole job."""
        return self.trainers * self.gpus

    def eligible(self, host: Host) -> bool:
        """Whether ``host`` may hold one of its trainers at all (pool and label)."""
        return (self.pool is None or host.pool == self.pool) and host.has_label(self.label)

    def describe(self) -> str:
        """``2 trainers x (2 GPUs, 1 CPU)``, ``4 GPUs`` (the words of the waiting reason)."""
        parts = []
        if self.gpus:
            parts.append(_count(self.gpus, f"{self.label} GPU" if self.label else "GPU"))
        if self.cpus:
            parts.append(_count(self.cpus, "CPU"))
        if self.memory:
            parts.append(f"{format_memory(self.memory)} memory")
        each = ", ".join(parts) or "nothing"
        if self.trainers == 1:
            return each
        return f"{self.trainers} hosts with {each} each"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Slot:
    """What one trainer holds on its host."""

    host: str
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = ()
    memory: int = 0


@dataclass(frozen=True)
class Placement:
    """Where a job's trainers run: one :class:`Slot` each, in rank order (rank 0 first)."""

    slots: tuple[Slot, ...] = field(default_factory=tuple)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Each trainer's host, in rank order."""
        return tuple(s.host for s in self.slots)

    def to_dict(self) -> list[dict[str, object]]:
        """Its JSON form (kept in the job's row, written to the placement log)."""
        return [
            {"host": s.host, "gpus": list(s.gpus), "cpus": list(s.cpus), "memory": s.memory}
            for s in self.slots
        ]

    @classmethod
    def from_dict(cls, data: Sequence[Mapping[str, Any]]) -> Placement:
        """The placement of :meth:`to_dict`'s form."""
        return cls(
            tuple(
                Slot(
                    str(d["host"]),
                    tuple(int(i) for i in d.get("gpus") or ()),
                    tuple(int(i) for i in d.get("cpus") or ()),
                    int(d.get("memory") or 0),
                )
                for d in data
            )
        )
