"""Resource samples of a node's processes: CPU, memory, threads, open files, GPU.

Whoever watches a node's process samples it once a second (a supervisor on its host;
the launcher's thread for ``local_mp``): :class:`TreeSampler` reads the ``/proc``
files of the node's process and its descendants only, found through
``/proc/PID/task/TID/children``. A whole-``/proc`` scan (how ``psutil`` finds
children) reads every process of the host, each second, for each node: on a host
of a few hundred processes and eight nodes that alone is several percent of a core;
this stays near 0.1 ms a node (``bench/sampling.py`` measures both). GPU use comes
from NVML (``nvidia-ml-py``, where installed and a driver answers) per process; else
``nvidia-smi`` where present, every :data:`SMI_EVERY` seconds (memory only: it costs
~50 ms a call); else none.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, NamedTuple

__all__ = ["SMI_EVERY", "GpuSampler", "Sample", "TreeSampler", "host_memory"]

SMI_EVERY = 10.0
"""Seconds between ``nvidia-smi`` calls where NVML is not importable."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Sample(NamedTuple):
    """One look at a node's processes (the node's process and its descendants).

    Attributes:
        t: when, seconds since the epoch.
        cpu: CPU used since the last look, in percent of one core (200: two cores busy).
        rss: resident memory of its processes, bytes (shared pages counted in each).
        threads: threads of its processes.
        fds: open file descriptors of its processes.
        procs: its processes.
        gpu: GPU use of its processes, percent (summed over GPUs); None without NVML.
        gpu_mem: GPU memory of its processes, bytes; None where no GPU is known.
        host_available: memory its host has left for new use (``MemAvailable``), bytes.
    """

    t: float
    cpu: float
    rss: int
    threads: int
    fds: int
    procs: int
    gpu: float | None = None
    gpu_mem: int | None = None
    host_available: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON values."""
        return self._asdict()


def host_memory() -> int | None:
    """``MemAvailable`` of this host in bytes (None where ``/proc/meminfo`` has none)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's), from ``/proc``; [] if it is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(CPU ticks, threads, start time, resident pages) of ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2 :].split()
    return int(rest[11]) + int(rest[12]), int(rest[17]), int(rest[19]), int(rest[21])


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # gone, or not ours to look at
        return 0


class TreeSampler:
    """Samples a process and its descendants (see the module docstring); one per watcher.

    CPU is the ticks each process (known by pid and start time) used since the
    previous :meth:`sample`; a process new since then counts from the next one.
    """

    def __init__(self, gpu: GpuSampler | None = None) -> None:
        self._ticks: dict[tuple[int, int], int] = {}
        self._at = 0.0
        self._gpu = gpu

    def sample_of(self, proc: Any) -> Sample | None:
        """:meth:`sample` of ``proc`` (a ``Popen``-like: ``pid``, ``poll()``); None if there is
        none now (between two of a restarting node's processes) or it is ending."""
        if proc is None or proc.poll() is not None:
            return None
        try:
            return self.sample(proc.pid)
        except (OSError, ValueError, IndexError):  # /proc of a process as it ends
            return None

    def sample(self, root: int) -> Sample | None:
        """A look at ``root`` and its descendants now; None if ``root`` is gone."""
        now, mono = time.time(), time.monotonic()
        pids, todo, seen = [], [root], {root}
        while todo:
            pid = todo.pop()
            pids.append(pid)
            for child in _children(pid):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        ticks: dict[tuple[int, int], int] = {}
        used = threads = pages = fds = 0
        for pid in pids:
            stat = _stat(pid)
            if stat is None:
                continue
            total, n_threads, start, rss = stat
            ticks[(pid, start)] = total
            before = self._ticks.get((pid, start))
            if before is not None:
                used += total - before
            threads += n_threads
            pages += rss
            fds += _fds(pid)
        if not ticks:
            return None
        elapsed = mono - self._at if self._at else 0.0
        cpu = 100.0 * used / _TICK / elapsed if elapsed > 0 else 0.0
        self._ticks, self._at = ticks, mono
        gpu, gpu_mem = self._gpu.of([p for p, _ in ticks]) if self._gpu is not None else (None, None)
        memory = host_memory()
        return Sample(now, round(cpu, 1), pages * _PAGE, threads, fds, len(ticks), gpu, gpu_mem, memory)


class GpuSampler:
    """GPU use and memory of given processes: NVML where importable, else ``nvidia-smi`` (memory)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._devices: list[Any] = []
        self._seen: dict[int, int] = {}  # device index -> the last utilization sample's time stamp
        self._smi: str | None = None
        self._smi_at = 0.0
        self._smi_mem: dict[int, int] = {}
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._devices = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except Exception:  # not installed, no driver, no device: try nvidia-smi
            import shutil

            self._smi = shutil.which("nvidia-smi")

    @property
    def available(self) -> bool:
        """Whether any GPU can be asked about."""
        return self._nvml is not None or self._smi is not None

    def of(self, pids: list[int]) -> tuple[float | None, int | None]:
        """(use in percent, memory in bytes) of ``pids`` on every GPU; (None, None) without GPUs."""
        if self._nvml is not None:
            return self._from_nvml(set(pids))
        if self._smi is not None:
            return None, self._from_smi(set(pids))
        return None, None

    def _from_nvml(self, pids: set[int]) -> tuple[float | None, int | None]:
        nvml = self._nvml
        use, mem = 0.0, 0
        for index, device in enumerate(self._devices):
            with contextlib.suppress(nvml.NVMLError):
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(device):
                    if proc.pid in pids and proc.usedGpuMemory:
                        mem += int(proc.usedGpuMemory)
            with contextlib.suppress(nvml.NVMLError):  # NotFound: no sample since the last
                samples = nvml.nvmlDeviceGetProcessUtilization(device, self._seen.get(index, 0))
                for s in samples:
                    self._seen[index] = max(self._seen.get(index, 0), int(s.timeStamp))
                    if s.pid in pids:
                        use += float(s.smUtil)
        return use, mem

    def _from_smi(self, pids: set[int]) -> int | None:
        if time.monotonic() - self._smi_at >= SMI_EVERY:
            import subprocess

            self._smi_at = time.monotonic()
            query = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
            try:
                out = subprocess.run(
                    [str(self._smi), *query], capture_output=True, text=True, timeout=5.0, check=False
                ).stdout
            except (OSError, subprocess.SubprocessError):
                return None
            self._smi_mem = {}
            for line in out.splitlines():
                with contextlib.suppress(ValueError):
                    pid, mib = (int(x) for x in line.split(","))
                    self._smi_mem[pid] = self._smi_mem.get(pid, 0) + (mib << 20)
        return sum(m for p, m in self._smi_mem.items() if p in pids)
