"""Preflight: each host checked as soon as its connection opens, before anything starts there.

One exec a host (``sh -c PREFLIGHT``): the setup commands, the Python and tlaunch
versions (remembered by the host while its interpreter's files stay the same),
tmux, tar, the runs folder. The shell then stays on its channel, held
(:func:`tlaunch.ssh.held.run_held`): it runs the start (its files come on its
stdin, counted: :mod:`tlaunch.backends.ssh.shipping`; where the host's ``head``
is not GNU's, the start is an exec of its own), then becomes the host's log
tail once the head's address is known.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import tlaunch
from tlaunch.backends.base import Progress
from tlaunch.backends.ssh.hostside import RUNS
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.errors import SSHError
from tlaunch.ssh import Connection, Held, connect_all, let_go_all, run_held

__all__ = ["PREFLIGHT", "PROBE", "HostFacts", "Preflight", "connect_and_check"]


def connect_and_check(
    hosts: list[str],
    opts: SSHOptions,
    cmd_env: Mapping[str, str],
    progress: Progress,
    held: dict[str, Held],
    shared: Sequence[str] = (),
    scratch: str | None = None,
    then: Callable[[Connection, HostFacts], object] | None = None,
) -> tuple[dict[str, Connection], dict[str, HostFacts]]:
    """Connect to every host, each checked as soon as its connection opens (while slower
    hosts still shake hands: the phases "connect" and "preflight" overlap; "connect" ends
    with the last connection). ``held`` gets each host's waiting shell; none stays if any
    host fails. ``then``: run on each host that passed, as soon as it did (while other hosts
    are checked); what it writes belongs in ``scratch`` (a path below the home directory),
    which each host's shell removes if the launch goes no further (:func:`run_held`): a
    host failed, the launch was interrupted, or the launcher's connection dropped.

    Returns:
        The connections, and what each host said.

    Raises:
        HostsError: every problem of every host (nothing was started anywhere).
    """
    t0 = last = time.perf_counter()
    with (
        progress.phase("connect", len(hosts)) as connected,
        progress.phase("preflight", len(hosts)) as checked,
    ):
        checks = Preflight(opts, cmd_env, checked, held, shared, scratch)

        def check(conn: Connection) -> None:
            nonlocal last
            connected()
            last = time.perf_counter()
            facts = checks.check(conn)
            if then is not None:
                then(conn, facts)

        try:
            conns = connect_all(
                hosts,
                ssh_config=opts.ssh_config,
                accept_unknown_hosts=opts.accept_unknown_hosts,
                timeout=opts.connect_timeout,
                then=check,
                release=lambda: let_go_all(held),
            )
        except BaseException:
            let_go_all(held)
            raise
    progress.times["connect"] = last - t0
    return conns, checks.facts


# What preflight asks each host's Python (argv: the cache file, the interpreter as the shell
# found it, what tmux and head said, the shell's PATH, where tmux and head are): its version and
# tlaunch's. It remembers the answers in the cache file with the identity (inode, mtime, ctime)
# of the interpreter, tlaunch's ``__init__``, tmux, head and every folder on its path, unless one
# of them changed in the last 2 s (an install under way): a later preflight whose files all
# match (and whose PATH is the same) takes the answers without starting Python (~40 ms of the
# host's CPU), tmux or head (~3 ms). Installing or removing anything on the path changes a
# folder's mtime.
PROBE = """
import os, sys, time, tlaunch
said = "%d.%d %s" % (sys.version_info[0], sys.version_info[1], tlaunch.__version__)
print(said, flush=True)
def remember(cache, exe, tmux_said, head_said, path, tmux, head):
    paths = [exe, os.path.realpath(sys.executable), tlaunch.__file__, tmux, head]
    paths = list(dict.fromkeys(paths + [p for p in sys.path if p and os.path.isdir(p)]))
    told = [said, exe, tmux_said, head_said, path]
    if not (exe and tmux and head) or not tmux_said.startswith("tmux 0 "):
        return
    if any("\\n" in p or "|" in p for p in paths) or any("\\n" in t for t in told):
        return
    lines = []
    for p in paths:
        st = os.stat(p)
        if max(st.st_mtime, st.st_ctime) > time.time() - 2:
            return
        lines.append("%s|%d|%d|%d" % (p, st.st_ino, int(st.st_mtime), int(st.st_ctime)))
    part = "%s.%d.part" % (cache, os.getpid())
    with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("\\n".join(told + [str(len(paths))] + paths + lines) + "\\n")
    os.replace(part, cache)
if len(sys.argv) == 8:
    try:
        remember(*sys.argv[1:])
    except Exception:
        pass
"""

# The checks, one exec a host (each exec is a fork in sshd and a round trip). Arguments: N and
# N paths that must exist, the probe's cache file, the interpreter, the probe's argv.
# ``cached`` (its input: the cache file) says what the probe, tmux and head said if the
# PATH is the same and every file it named still has the identity it had (``stat -L``; where
# ``stat -c`` is unknown it never matches); it runs in this shell (no fork to capture it).
# What the checks say goes into ``$R``, which the held shell says with its mark: one write,
# one packet (each more costs the launcher ~0.3 ms of paramiko's CPU).
PREFLIGHT = (
    'L="\n"; n=$1; shift; while [ "$n" -gt 0 ]; do [ -e "$1" ] || R="${R}missing $1$L"; '
    "n=$((n-1)); shift; done; "
    'R="${R}where $SSH_CONNECTION$L"; C=$1; P=$2; shift 2; '
    "cached() { IFS= read -r said && IFS= read -r exe && IFS= read -r tm && IFS= read -r hd && "
    "IFS= read -r path && IFS= read -r n || return 1; "
    '[ "$path" = "$PATH" ] && [ -n "$exe" ] && [ "$exe" = "$(command -v "$1")" ] || return 1; '
    'set --; i=0; want=""; '
    'while [ "$i" -lt "$n" ]; do IFS= read -r p || return 1; set -- "$@" "$p"; i=$((i+1)); done; '
    'while IFS= read -r l; do want="${want:+$want\n}$l"; done; '
    "got=$(stat -L -c '%n|%i|%Y|%Z' -- \"$@\" 2>/dev/null) || return 1; "
    '[ "$got" = "$want" ] && R="${R}python 0 $said$L$tm$L$hd$L"; }; '
    f"if [ -d {RUNS} ] && [ -w {RUNS} ]; then err=; else "
    f"err=$(mkdir -p -m 700 .tlaunch {RUNS} 2>&1 && test -w {RUNS} 2>&1); fi; "
    'R="${R}runs $? $err$L"; '
    'if cached "$P" 2>/dev/null < "$C"; then :; '
    'else v=$(tmux -V 2>/dev/null); tm="tmux $? $v"; '
    'case $(head --version 2>/dev/null) in *GNU*) hd="head 0";; *) hd="head 1";; esac; '
    'out=$("$@" "$C" "$(command -v "$P")" "$tm" "$hd" "$PATH" "$(command -v tmux)" '
    '"$(command -v head)" 2>&1); rc=$?; '
    'R="${R}python $rc $(printf %s "$out" | tail -n 1)$L$tm$L$hd$L"; fi; '
    'command -v tar >/dev/null && command -v gzip >/dev/null; R="${R}tar $?$L"'
)


class HostFacts(NamedTuple):
    """What preflight learnt of a host."""

    launcher: str
    """The launcher's address as the host sees it (``SSH_CONNECTION``)."""
    address: str
    """The host's own address, where the launcher reached it."""
    tmux: tuple[int, int]
    """Its tmux version (major, minor; ``(0, 0)``: unknown)."""


def tmux_version(said: str) -> tuple[int, int]:
    """``(3, 3)`` from what ``tmux -V`` said (``tmux 3.3a``, ``tmux next-3.4``); ``(0, 0)``: unknown."""
    found = re.search(r"(\d+)\.(\d+)", said)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def probe_cache(python: str, pythonpath: str) -> str:
    """The file (relative to the home directory) where a host remembers what ``python`` said."""
    digest = hashlib.sha256(f"2\0{python}\0{pythonpath}".encode()).hexdigest()[:20]  # 2: its format
    return f".tlaunch/probe-{digest}"


class Preflight:
    """Each host's checks (:meth:`check`, as soon as its connection opens): setup commands,
    Python and tlaunch versions, tmux, tar, the runs dir.

    Args:
        opts: the launch's SSH options.
        cmd_env: the environment the host's processes start with (``PYTHONPATH``).
        tick: called once a host is checked.
        held: where each host's preflight shell is kept, waiting on its channel for a
            command to run in its place (the start, then the log tail).
        shared: paths every host must see (a shared filesystem: ``working_dir=False``).
        scratch: what each host's waiting shell removes unless the launch goes on
            (:func:`tlaunch.ssh.held.run_held`).
    """

    def __init__(
        self,
        opts: SSHOptions,
        cmd_env: Mapping[str, str],
        tick: Callable[[], None],
        held: dict[str, Held],
        shared: Sequence[str] = (),
        scratch: str | None = None,
    ) -> None:
        self.opts, self.cmd_env, self.tick, self.held, self.shared = opts, cmd_env, tick, held, shared
        self.scratch = scratch
        self.facts: dict[str, HostFacts] = {}
        """What each host checked so far said."""

    def check(self, conn: Connection) -> HostFacts:
        """Check ``conn``'s host.

        Raises:
            SSHError: every problem of the host, in one message.
        """
        try:
            facts = _check(conn, self.opts, self.cmd_env, self.held, self.shared, self.scratch)
            self.facts[conn.host] = facts
        finally:
            self.tick()
        return facts


def _check(
    conn: Connection,
    opts: SSHOptions,
    cmd_env: Mapping[str, str],
    held: dict[str, Held],
    shared: Sequence[str],
    scratch: str | None,
) -> HostFacts:
    """:meth:`Preflight.check`."""
    host = conn.host
    want = f"{sys.version_info[0]}.{sys.version_info[1]} {tlaunch.__version__}"
    problems = []
    for command in opts.setup_for(host):
        done = conn.run(["sh", "-c", command], check=False, pty=True)
        if done.exit_status != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            problems.append(f"setup command {command!r} exited with {done.exit_status}: {tail}")
            break
    python = opts.python_for(host)
    cache = probe_cache(python, cmd_env.get("PYTHONPATH", ""))
    argv = ["env", *(f"{k}={v}" for k, v in cmd_env.items()), python, "-c", PROBE]
    args = [str(len(shared)), *shared, cache, python, *argv]
    said, shell = run_held(conn, PREFLIGHT, args, scratch=scratch)
    lines = {line.split(" ", 1)[0]: line.partition(" ")[2] for line in said.splitlines() if line}
    if shell is not None:
        shell.counted_stdin = lines.get("head") == "0"  # it can run the start (the files on stdin)
        held[host] = shell  # dict assignment: safe from the pool's threads
    missing = [line.partition(" ")[2] for line in said.splitlines() if line.startswith("missing ")]
    if missing:
        problems.append(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: working_dir=False "
            "(--no-ship) runs the launcher's paths on every host, so they must share its filesystem; "
            "ship the folder instead (drop working_dir=False / --no-ship), or make it reachable there"
        )
    where = lines.get("where", "").split()
    if len(where) < 3:
        raise SSHError(host, f"the preflight checks did not run (they printed {said!r})")
    code, _, got = lines.get("python", "1 ?").partition(" ")
    if code != "0":
        problems.append(
            f"{python} cannot import tlaunch ({got or '?'}); install tlaunch {tlaunch.__version__} there"
        )
    elif got.strip() != want:
        problems.append(
            f"has Python/tlaunch {got.strip()!r}, the launcher {want!r}; cloudpickle needs the "
            "same Python minor version and tlaunch version on every host"
        )
    if lines.get("tmux", "1").split(" ", 1)[0] != "0":
        problems.append("tmux is missing (apt-get install tmux)")
    if lines.get("tar", "1") != "0":
        problems.append("tar or gzip is missing: tlaunch ships files with them (apt-get install tar gzip)")
    code, _, err = lines.get("runs", "1 ?").partition(" ")
    if code != "0":
        problems.append(f"~/{RUNS} is not writable ({err.strip()})")
    if problems:
        raise SSHError(host, "; ".join(problems))
    return HostFacts(where[0], where[2], tmux_version(lines.get("tmux", "")))
