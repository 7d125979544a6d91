"""What the SSH backend runs on a host: the preflight probe and the last-resort cleanup.

Each is a short POSIX ``sh`` script given as ``sh -c SCRIPT sh ARG...``: the
values travel as arguments, never spliced into the script. A host costs the
launcher one exec for preflight and one for cleanup: each exec is a round
trip, a fork of sshd, and ~1 ms of the launcher's CPU (paramiko's packets),
which at 1000 hosts is a second a step. Preflight's shell stays on its channel
afterwards, held (:func:`tlaunch.ssh.held.run_held`): it runs the start (its
files come on its stdin, counted: :mod:`tlaunch.backends.ssh.shipping`; where
the host's ``head`` is not GNU's, the start is an exec of its own), then
becomes the host's log tail once the head's address is known.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import tlaunch
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.backends.tmux import session_of
from tlaunch.errors import LaunchError, SSHError
from tlaunch.procs import MARKER
from tlaunch.rpc.shm import DIR as SHM_DIR
from tlaunch.ssh import Connection, Held, let_go_all, pmap, raise_for_hosts, run_held
from tlaunch.ssh.tail import RemoteTail

__all__ = [
    "RUNS",
    "HostFacts",
    "Preflight",
    "clean_host",
    "head_address",
    "kill_script",
    "preflight",
    "run_dir_of",
    "write_text",
]

RUNS = ".tlaunch/runs"


def run_dir_of(run_id: str) -> str:
    """The run's directory on each host, relative to the home directory."""
    return f"{RUNS}/{run_id}"


# What preflight asks each host's Python (argv: the cache file, the interpreter as the shell
# found it): its version and tlaunch's. It remembers the answer in the cache file with the
# identity (inode, mtime, ctime) of the interpreter, tlaunch's ``__init__`` and every folder
# on its path, unless one of them changed in the last 2 s (an install under way): a later
# preflight whose files all match takes the answer without starting Python (~40 ms of the
# host's CPU). Installing or removing anything on the path changes a folder's mtime.
PROBE = """
import os, sys, time, tlaunch
said = "%d.%d %s" % (sys.version_info[0], sys.version_info[1], tlaunch.__version__)
print(said, flush=True)
def remember(cache, exe):
    paths = [exe, os.path.realpath(sys.executable), tlaunch.__file__]
    paths = list(dict.fromkeys(paths + [p for p in sys.path if p and os.path.isdir(p)]))
    if not exe or any("\\n" in p or "|" in p for p in paths):
        return
    lines = []
    for p in paths:
        st = os.stat(p)
        if max(st.st_mtime, st.st_ctime) > time.time() - 2:
            return
        lines.append("%s|%d|%d|%d" % (p, st.st_ino, int(st.st_mtime), int(st.st_ctime)))
    part = "%s.%d.part" % (cache, os.getpid())
    with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("\\n".join([said, exe, str(len(paths))] + paths + lines) + "\\n")
    os.replace(part, cache)
if len(sys.argv) == 3:
    try:
        remember(sys.argv[1], sys.argv[2])
    except Exception:
        pass
"""

# The checks, one exec a host (each exec is a fork in sshd and a round trip). Arguments: N and
# N paths that must exist, the probe's cache file, the interpreter, the probe's argv.
# ``cached`` (its input: the cache file) prints what the probe said if every file it named
# still has the identity it had (``stat -L``; where ``stat -c`` is unknown it never matches).
PREFLIGHT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do [ -e "$1" ] || printf "missing %s\\n" "$1"; '
    "n=$((n-1)); shift; done; "
    'printf "where %s\\n" "$SSH_CONNECTION"; C=$1; P=$2; shift 2; '
    "cached() { IFS= read -r said && IFS= read -r exe && IFS= read -r n || return 1; "
    '[ -n "$exe" ] && [ "$exe" = "$(command -v "$1")" ] || return 1; set --; i=0; want=""; '
    'while [ "$i" -lt "$n" ]; do IFS= read -r p || return 1; set -- "$@" "$p"; i=$((i+1)); done; '
    'while IFS= read -r l; do want="${want:+$want\n}$l"; done; '
    "got=$(stat -L -c '%n|%i|%Y|%Z' -- \"$@\" 2>/dev/null) || return 1; "
    '[ "$got" = "$want" ] && printf "%s\\n" "$said"; }; '
    f"if [ -d {RUNS} ] && [ -w {RUNS} ]; then err=; else "
    f"err=$(mkdir -p -m 700 .tlaunch {RUNS} 2>&1 && test -w {RUNS} 2>&1); fi; "
    'printf "runs %s %s\\n" "$?" "$err"; '
    'if out=$(cached "$P" 2>/dev/null < "$C"); then printf "python 0 %s\\n" "$out"; '
    'else out=$("$@" "$C" "$(command -v "$P")" 2>&1); rc=$?; '
    'printf "python %s %s\\n" "$rc" "$(printf %s "$out" | tail -n 1)"; fi; '
    'v=$(tmux -V 2>/dev/null); printf "tmux %s %s\\n" "$?" "$v"; '
    'command -v tar >/dev/null && command -v gzip >/dev/null; printf "tar %s\\n" "$?"; '
    'case $(head --version 2>/dev/null) in *GNU*) printf "head 0\\n";; *) printf "head 1\\n";; esac'
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
    digest = hashlib.sha256(f"{python}\0{pythonpath}".encode()).hexdigest()[:20]
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
    """

    def __init__(
        self,
        opts: SSHOptions,
        cmd_env: Mapping[str, str],
        tick: Callable[[], None],
        held: dict[str, Held],
        shared: Sequence[str] = (),
    ) -> None:
        self.opts, self.cmd_env, self.tick, self.held, self.shared = opts, cmd_env, tick, held, shared
        self.facts: dict[str, HostFacts] = {}
        """What each host checked so far said."""

    def check(self, conn: Connection) -> HostFacts:
        """Check ``conn``'s host.

        Raises:
            SSHError: every problem of the host, in one message.
        """
        try:
            self.facts[conn.host] = facts = _check(conn, self.opts, self.cmd_env, self.held, self.shared)
        finally:
            self.tick()
        return facts


def preflight(
    conns: Mapping[str, Connection],
    opts: SSHOptions,
    cmd_env: Mapping[str, str],
    tick: Callable[[], None],
    held: dict[str, Held],
    shared: Sequence[str] = (),
) -> dict[str, HostFacts]:
    """Check every host of ``conns`` at once (:class:`Preflight`); none's shell is kept if any fails.

    Returns:
        What each host said (:class:`HostFacts`).

    Raises:
        HostsError: every problem of every host.
    """
    checks = Preflight(opts, cmd_env, tick, held, shared)
    results = pmap(lambda host: checks.check(conns[host]), list(conns), conns)
    try:
        raise_for_hosts(results)
    except BaseException:
        let_go_all(held)
        raise
    return checks.facts


def _check(
    conn: Connection,
    opts: SSHOptions,
    cmd_env: Mapping[str, str],
    held: dict[str, Held],
    shared: Sequence[str],
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
    said, shell = run_held(conn, PREFLIGHT, args)
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


def head_address(conn: Connection, run_dir: str, session: str, held: Held | None = None) -> str:
    """The head's ``coordinator.addr`` once it serves (it writes the file then), read on its host
    by its preflight shell, ``held``, where it waits (no exec), else by an exec.

    Raises:
        LaunchError: the head's session ended, or no address within 30 s (with its log's end).
    """
    # The wait's own CPU is the head's, while it starts: one exec (sleep) a turn, and a look at
    # the session every tenth.
    script = (
        'i=0; while [ ! -s "$1" ]; do if [ $((i % 10)) -eq 0 ]; then '
        'tmux has-session -t "=$2" 2>/dev/null || exit 2; fi; '
        'i=$((i+1)); [ $i -gt 1500 ] && exit 1; sleep 0.02; done; cat "$1"'
    )
    argv = ["sh", "-c", script, "sh", f"{run_dir}/coordinator.addr", session]
    if held is not None and held.can_run(argv):
        status, said = held.run(argv, timeout=60.0)
    else:
        done = conn.run(argv, check=False, timeout=60.0)
        status, said = done.exit_status, done.stdout
    if status != 0:
        log = conn.run(["tail", "-n", "20", f"{run_dir}/logs/coordinator.log"], check=False)
        raise LaunchError(f"the coordinator did not start on {conn.host}:\n{log.stdout}")
    return said


def write_text(conn: Connection, path: str, text: str) -> None:
    """Write ``text`` (no secret: it travels as an argument) to ``path`` on the host, 0600, atomically."""
    conn.run(["sh", "-c", 'umask 077 && printf %s "$2" > "$1.part" && mv "$1.part" "$1"', "sh", path, text])


def kill_script() -> str:
    """Shell (any POSIX sh: dash too): kill what is left of a run on this host, and confirm it.

    Arguments: the run id, its tmux session, then pids (``123``) or process
    groups (``-123``) the run's records name. A process is killed only if it
    carries the run's marker (``TLAUNCH_RUN_ID=<run id>`` in its environment,
    which every process of the run inherits) and lives in this host's network
    namespace: a recorded pid that now belongs to someone else is left alone.
    Every other process with the marker goes too (a child that left its
    process group), then the tmux session. Once they are gone, so are the
    Unix-socket rendezvous names (:mod:`tlaunch.rpc.fdpass`) a killed server
    had open in the host's ``/dev/shm`` (killed between offering one and its
    client's connect, it could not remove it). Prints ``left: PIDS`` and exits 1
    if any of them is still alive (not a zombie) after 5 s.
    """
    return (
        f'R="$1"; S="$2"; shift 2; M="{MARKER}=$R"; me=$(readlink /proc/$$/ns/net); '
        'ours() { [ "$(readlink /proc/$1/ns/net 2>/dev/null)" = "$me" ] && '
        'tr "\\000" "\\n" < /proc/$1/environ 2>/dev/null | grep -qxF "$M"; }; '
        "alive() { [ -e /proc/$1 ] && ! grep -q '^State:[[:space:]]*Z' /proc/$1/status 2>/dev/null; }; "
        'P=$(tmux list-panes -s -t "=$S" -F "#{pane_pid}" 2>/dev/null); '
        'G=""; for p in "$@"; do case "$p" in -*) G="$G ${p#-}";; *) P="$P $p";; esac; done; '
        # Members of the given groups: the group is field 5 of stat, the 3rd after "comm) ".
        '[ -n "$G" ] && for d in /proc/[0-9]*; do read -r l < "$d/stat" 2>/dev/null || continue; '
        'set -- ${l##*) }; for g in $G; do [ "$3" = "$g" ] && P="$P ${d#/proc/}"; done; done; '
        'P="$P $(grep -lzxF "$M" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)"; '
        'K=""; for p in $P; do [ "$p" = "$$" ] && continue; ours "$p" && K="$K $p"; done; '
        'for p in $K; do kill -s KILL -- "$p" 2>/dev/null; done; '
        'tmux kill-session -t "=$S" 2>/dev/null; '
        "i=0; while [ $i -lt 50 ]; do left=''; "
        'for p in $K; do alive "$p" && left="$left $p"; done; '
        f'[ -z "$left" ] && {{ for p in $K; do rm -f {SHM_DIR}/tlaunch-"$p"-*; done; exit 0; }}; '
        'i=$((i+1)); sleep 0.1; done; echo "left:$left"; exit 1'
    )


def _clean_argv(
    run_id: str,
    pids: list[str],
    head_pid: int | None,
    remove_all: bool,
    keep_bundles: bool,
    tail_pid: str | None = None,
    drain: float = 0.0,
) -> list[str]:
    """The cleanup of :func:`clean_host`, as a command (it runs in the tail's shell, or as an exec)."""
    remove = "all" if remove_all else ("" if keep_bundles else "secrets")
    script = (
        'H="$1"; T="$2"; D="$3"; W="$4"; X="$5"; K="$6"; shift 6; '
        'if [ -n "$H" ]; then i=0; while kill -0 "$H" 2>/dev/null && [ $i -lt 30 ]; do '
        "i=$((i+1)); sleep 0.1; done; fi; "
        'out=$(sh -c "$K" sh "$@"); rc=$?; '
        'if [ -n "$T" ]; then sleep "$W"; kill -- "-$T" 2>/dev/null; fi; '
        'case "$X" in all) rm -rf "$D";; secrets) rm -rf "$D"/*.node "$D"/head.pkl "$D"/work* '
        '"$D"/modules "$D"/blobs "$D"/alive;; esac; '
        'printf "%s" "$out"; exit $rc'
    )
    return [
        "sh",
        "-c",
        script,
        "sh",
        str(head_pid or ""),
        tail_pid or "",
        run_dir_of(run_id),
        f"{drain:.2f}",
        remove,
        kill_script(),
        run_id,
        session_of(run_id),
        *pids,
    ]


def clean_host(
    conn: Connection,
    run_id: str,
    pids: list[str],
    head_pid: int | None,
    remove_all: bool,
    keep_bundles: bool,
    tail_pid: str | None = None,
    drain: float = 0.0,
    reach: float = 3.0,
    tail: RemoteTail | None = None,
) -> str:
    """Kill what is left of run ``run_id`` on the host, end its log tail, remove its secrets.

    One command: the last one of the host's log tail, ``tail``, where it runs
    (a packet on its channel), else an exec. The head lingers until released:
    it gets 3 s to write its end. The log tail (process group ``tail_pid``) is
    ended ``drain`` s after the kill, for the last lines to come through.

    Returns:
        The kill script's answer: empty, or ``left: PIDS`` for processes still alive.

    Raises:
        SSHError: the host did not answer within ``reach`` s (its link is down), or the command failed.
    """
    if tail is not None:
        argv = _clean_argv(run_id, pids, head_pid, remove_all, keep_bundles)
        try:
            return tail.finish(argv, drain=drain, reach=reach).strip()
        except ValueError:
            pass  # the tail is not running (or the command cannot travel as lines): an exec
        except SSHError as exc:
            raise SSHError(conn.host, f"the cleanup did not run: {str(exc).split(': ', 1)[-1]}") from exc
    argv = _clean_argv(run_id, pids, head_pid, remove_all, keep_bundles, tail_pid, drain)
    try:
        return conn.run(argv, check=False, timeout=25.0, start_timeout=reach).stdout.strip()
    except SSHError as exc:  # said without the script, which would fill a screen per host
        why = exc.__cause__ or "it did not finish within 25 s"
        raise SSHError(conn.host, f"the cleanup did not run: {why or type(why).__name__}") from exc
