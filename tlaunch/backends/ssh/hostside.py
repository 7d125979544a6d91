"""What the SSH backend runs on a host besides preflight (:mod:`tlaunch.backends.ssh.preflight`):
the wait for the head's address, the last-resort cleanup.

Each is a short POSIX ``sh`` script given as ``sh -c SCRIPT sh ARG...``: the
values travel as arguments, never spliced into the script. An exec is a round
trip, a fork of sshd, and ~1 ms of the launcher's CPU (paramiko's packets),
which at 1000 hosts is a second a step: where preflight's shell still waits on
its channel (:func:`tlaunch.ssh.held.run_held`), it runs them instead.
"""

from __future__ import annotations

from tlaunch.backends.tmux import session_of
from tlaunch.errors import LaunchError, SSHError
from tlaunch.procs import MARKER
from tlaunch.rpc.shm import DIR as SHM_DIR
from tlaunch.runtime.head import WAKE
from tlaunch.ssh import Connection, Held
from tlaunch.ssh.tail import RemoteTail

__all__ = ["RUNS", "clean_host", "head_address", "kill_script", "run_dir_of"]

RUNS = ".tlaunch/runs"


def run_dir_of(run_id: str) -> str:
    """The run's directory on each host, relative to the home directory."""
    return f"{RUNS}/{run_id}"


def head_address(conn: Connection, run_dir: str, session: str, held: Held | None = None) -> str:
    """The head's ``coordinator.addr`` once it serves (it writes the file then), read on its host
    by its preflight shell, ``held``, where it waits (no exec), else by an exec.

    Raises:
        LaunchError: the head's session ended, or no address within 30 s (with its log's end).
    """
    # The shell reads the FIFO the head writes a line to once it serves (WAKE; opened
    # read-write: the open never blocks, and a line written before the read waits in it),
    # after it looked at the file (a head that wrote before the FIFO had a reader, ENXIO to
    # it, wrote the file first). Meanwhile a watcher looks at the session every 0.5 s (and
    # at the file every 5 s) and writes a line itself once the session ended, the file is
    # there or 30 s passed; it is ended (its sleep too) and waited for. The wait costs the
    # head host, while the head starts, an exec (sleep) and tmux every 0.5 s, where a poll of
    # the file every 20 ms cost ~35 execs a launch and up to 20 ms of the launch's last part.
    # Without the FIFO (a tar that cannot make one) the file is polled so.
    script = (
        'F=$1; S=$2; if [ -p "$3" ] && exec 3<>"$3"; then '
        'if [ ! -s "$F" ]; then '
        "{ trap 'kill $s 2>/dev/null; exit 0' TERM; s=; i=0; "
        "while [ $i -lt 60 ]; do sleep 0.5 & s=$!; wait $s; s=; "
        'tmux has-session -t "=$S" 2>/dev/null || break; i=$((i+1)); '
        '[ $((i % 10)) -eq 0 ] && [ -s "$F" ] && break; done; echo >&3; } '
        "</dev/null >/dev/null 2>&1 & w=$!; IFS= read -r x <&3; kill $w 2>/dev/null; wait $w; fi; "
        '[ -s "$F" ] || exit 1; '
        'else i=0; while [ ! -s "$F" ]; do if [ $((i % 10)) -eq 0 ]; then '
        'tmux has-session -t "=$S" 2>/dev/null || exit 2; fi; '
        "i=$((i+1)); [ $i -gt 1500 ] && exit 1; sleep 0.02; done; fi; "
        'IFS= read -r a < "$F"; printf "%s" "$a"'  # one line (no exec of cat: this is the launch's path)
    )
    argv = ["sh", "-c", script, "sh", f"{run_dir}/coordinator.addr", session, f"{run_dir}/{WAKE}"]
    if held is not None and held.can_run(argv, stdin=False):
        status, said = held.run(argv, timeout=60.0)
    else:
        done = conn.run(argv, check=False, timeout=60.0)
        status, said = done.exit_status, done.stdout
    if status != 0:
        log = conn.run(["tail", "-n", "20", f"{run_dir}/logs/coordinator.log"], check=False)
        raise LaunchError(f"the coordinator did not start on {conn.host}:\n{log.stdout}")
    return said


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
    drain: float = 0.0,
    reach: float = 3.0,
    tail: RemoteTail | None = None,
) -> str:
    """Kill what is left of run ``run_id`` on the host, end its log tail, remove its secrets.

    One command: the last one of the host's log tail, ``tail``, where it runs
    (a packet on its channel), else an exec. The head lingers until released:
    it gets 3 s to write its end. The log tail is ended ``drain`` s after the
    kill, for the last lines to come through: by its own shell, or by the exec
    while that shell is known to run (a tail that ended is not signalled: its
    process group's number may be another's by then).

    Returns:
        The kill script's answer: empty, or ``left: PIDS`` for processes still alive.

    Raises:
        SSHError: the host did not answer within ``reach`` s (its link is down), or the command failed.
    """
    tail_pid = None
    if tail is not None:
        argv = _clean_argv(run_id, pids, head_pid, remove_all, keep_bundles)
        try:
            return tail.finish(argv, drain=drain, reach=reach).strip()
        except ValueError:  # the tail is not running (or the command cannot travel as lines): an exec
            tail_pid = tail.running_group()
        except SSHError as exc:
            raise SSHError(conn.host, f"the cleanup did not run: {str(exc).split(': ', 1)[-1]}") from exc
    argv = _clean_argv(run_id, pids, head_pid, remove_all, keep_bundles, tail_pid, drain)
    try:
        return conn.run(argv, check=False, timeout=25.0, start_timeout=reach).stdout.strip()
    except SSHError as exc:  # said without the script, which would fill a screen per host
        why = exc.__cause__ or "it did not finish within 25 s"
        raise SSHError(conn.host, f"the cleanup did not run: {why or type(why).__name__}") from exc
