"""Process checks shared by every layer (no tlaunch imports)."""

from __future__ import annotations

import os

__all__ = [
    "MARKER",
    "carries_marker",
    "pid_alive",
    "pid_exists",
    "pid_space",
    "process_start",
    "want_descriptors",
]

MARKER = "TLAUNCH_RUN_ID"
"""The environment variable every process of a run carries (its value: the run id), so that
what a run owns can be told from a pid reused by someone else since."""


def pid_exists(pid: int) -> bool:
    """Whether a process with ``pid`` exists (another user's counts; a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists and has not ended (a zombie, ended but not yet reaped
    by its parent, counts as gone)."""
    if not pid_exists(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def carries_marker(pid: int, run_id: str) -> bool:
    """Whether process ``pid`` belongs to run ``run_id`` (its environment carries the run's marker)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return False
    return f"{MARKER}={run_id}".encode() in entries


def pid_space() -> str:
    """Where this process's pids mean something: the running kernel's boot id and this process's
    pid namespace ("" where Linux does not say). Two processes with the same pid space see each
    other's pids; a record's pid from another (another machine sharing a home folder, another
    container) names nothing here.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if it does not exist.

    With the pid, it names a process for good: a pid reused later has another start.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])  # field 22 of stat, counted after the command's closing ')'


def want_descriptors(needed: int) -> int:
    """Raise the soft limit of open files to ``needed`` (at most the hard limit); returns the new soft limit.

    A run holds a few descriptors per host (the launcher: its SSH connection and
    a TLS connection per node it calls; the head: three sockets per host), and
    the usual soft limit of 1024 would refuse connections at a few hundred
    hosts. Daemons raise it the same way; the hard limit stays the bound.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a platform that refuses: the limit stays as it was
            pass
    return int(soft)
