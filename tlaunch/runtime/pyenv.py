"""Runtime environments: a virtualenv per package on each host that runs it, built once and reused.

A job's package may hold a ``requirements.txt``. Each host that runs the job
gets ``<root>/<sha256>/``, a virtualenv with those requirements installed,
and the job's processes run with its interpreter. The name is the sha256 of
the package's key (the sha256 of its upload) and the interpreter it is built
on, so later jobs of the same package on that host reuse it, and a host
with another Python gets its own.

- **Built once.** The build holds an exclusive lock (``<sha256>.lock``,
  ``fcntl.flock``: released by the kernel when its holder dies, so never
  stale); a job that finds it taken waits, then uses what the first one built.
- **Never half-made.** ``.tlaunch-env`` is written last; an environment
  without it (a build that failed or was killed) is removed by the next
  builder, under the lock, before it builds again. A failed build removes
  what it made and raises :class:`EnvBuildError` with pip's output.
- **Layered on the host's Python.** The environment sees its own
  site-packages first, then the site-packages of the interpreter that built
  it (a ``.pth`` file of ``site.addsitedir`` lines), so the host's tlaunch,
  torch and CUDA libraries stay importable and only the package's
  requirements are added. (``--system-site-packages`` alone does not do
  this when the host's tlaunch lives in a virtualenv: that flag reaches the
  base interpreter's site-packages, not the virtualenv's.) pip runs as the
  environment's interpreter (the host's pip, seen through that layer), so a
  requirement the host already meets is not installed again, and nothing
  needs ``ensurepip``.

It runs on the host, with the host's Python (``python -m tlaunch.runtime.pyenv``,
or this file run as a script where tlaunch is not installed: a pod's image)::

    ensure ROOT KEY FOLDER [--archive TGZ] [--report FILE]   build if needed; print {"python": ...}
    ensure ROOT KEY FOLDER --shell                           ... print the shell lines that activate it
    find ROOT KEY                                            print its python if built (exit 3 if not)
    exec ROOT KEY -- ARGS...                                 exec its python with ARGS

Relative paths in ``requirements.txt`` (a wheel shipped in the package:
``./wheels/x.whl``) are read from the package's folder: pip runs there.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import site
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

try:
    from tlaunch.errors import LaunchError
except ImportError:  # pragma: no cover - run as a file where tlaunch is not installed (a pod's init step)
    LaunchError = RuntimeError  # type: ignore[misc,assignment]

__all__ = [
    "Built",
    "EnvBuildError",
    "RuntimeEnv",
    "build",
    "ensure",
    "env_dir",
    "find",
    "has_requirements",
    "hold",
    "installer",
    "main",
    "python_of",
]

MARKER = ".tlaunch-env"
"""Written last into a finished environment: without it, an environment is half-made."""
NOT_BUILT = 3
"""``find``'s exit code for an environment not built (yet)."""
_TAIL = 60  # lines of pip's output an error keeps


@dataclass(frozen=True)
class RuntimeEnv:
    """What a job's runtime environment is made from.

    Attributes:
        folder: the package's folder on this machine; holds ``requirements``
            (and the files it names by relative path); pip runs there.
        key: names what the environment installs (:func:`tlaunch.runtime.envkey.env_key`):
            the same key, the same environment.
        requirements: the requirements file, relative to ``folder`` (or absolute).
    """

    folder: str
    key: str
    requirements: str = "requirements.txt"
    pip: tuple[str, ...] = ()
    """The requirements themselves (a job's ``pip: [...]``), in place of ``requirements``."""


@dataclass(frozen=True)
class Built:
    """An environment ready to use.

    Attributes:
        python: its interpreter.
        path: its folder.
        built: whether this call built it (else it was there, or another job built it meanwhile).
    """

    python: str
    path: str
    built: bool


class EnvBuildError(LaunchError):
    """Building a runtime environment failed.

    Attributes:
        summary: what failed, in one line.
        output: the end of pip's output.
        exit_code: pip's exit code.
        host: where it failed (None: this machine).
    """

    def __init__(
        self, message: str, output: str = "", exit_code: int | None = None, host: str | None = None
    ) -> None:
        super().__init__(message + (f"\n{output}" if output else ""))
        self.summary = message
        self.output = output
        self.exit_code = exit_code
        self.host = host

    def report(self) -> dict[str, object]:
        """The run's failure record of this build (``Failure.from_report`` reads it)."""
        return {
            "key": "runtime-env",
            "host": self.host or socket.gethostname(),
            "exit_code": self.exit_code,
            "reason": f"building the runtime environment failed: {self.summary}",
            "traceback": self.output or self.summary,
        }


def has_requirements(folder: str, requirements: str = "requirements.txt") -> bool:
    """Whether ``folder``'s requirements file names anything (blank lines and comments do not)."""
    path = os.path.join(folder, requirements)
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.split("#", 1)[0].strip() for line in f)


def env_dir(root: str, key: str) -> str:
    """The folder of ``key``'s environment under ``root``, for this interpreter on this platform."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    where = f"{sys.platform} {platform.machine()}"
    digest = hashlib.sha256(f"{key}\n{sys.executable}\n{version}\n{where}".encode()).hexdigest()
    return os.path.join(root, digest)


def python_of(path: str) -> str:
    """The interpreter of the environment at ``path``."""
    return os.path.join(path, "bin", "python")


def find(root: str, key: str) -> str | None:
    """The interpreter of ``key``'s environment, if it is built (it counts as used now)."""
    path = env_dir(root, key)
    if os.path.isfile(os.path.join(path, MARKER)) and os.path.exists(python_of(path)):
        _used(path)
        return python_of(path)
    return None


def _used(path: str) -> None:
    """Say that the environment at ``path`` was used now (its marker's time: what is kept longest)."""
    with contextlib.suppress(OSError):
        os.utime(os.path.join(path, MARKER))


def hold(root: str, key: str) -> int:
    """Hold ``key``'s environment in use (a shared lock) while the returned descriptor is open.

    :func:`tlaunch.runtime.envgc.collect` never removes an environment held so.
    The descriptor is inheritable: a process that calls ``exec`` (a job's
    launcher becoming the environment's interpreter) and its children hold it on.
    Opened read-only: a lock file this account may not write (a job server's) locks as well.
    """
    fd = os.open(env_dir(root, key) + ".lock", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    return fd


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def ensure(root: str, env: RuntimeEnv, out: TextIO | None = None) -> Built:
    """``env``'s environment under ``root``: built now if it is not yet, else as it is.

    Args:
        root: the folder of this host's environments (``<TLAUNCH_HOME>/envs``).
        env: what it is made from.
        out: where pip's output goes, as it comes (a job's log).

    Raises:
        EnvBuildError: the requirements could not be installed (pip's output is in the
            error); nothing of the attempt is left.
    """
    path = env_dir(root, env.key)
    if not find(root, env.key):
        os.makedirs(root, mode=0o700, exist_ok=True)
        with _locked(path + ".lock"):
            if not find(root, env.key):  # (else another job built it while this one waited)
                shutil.rmtree(path, ignore_errors=True)  # half-made: its builder failed or was killed
                build(path, env, out, scratch=root)
                return Built(python_of(path), path, built=True)
    return Built(python_of(path), path, built=False)


def build(path: str, env: RuntimeEnv, out: TextIO | None = None, scratch: str | None = None,
          user_site: bool = True) -> None:  # fmt: skip
    """Build ``env``'s environment at ``path`` (empty, or none), its marker last, read-only, with no lock
    (:func:`ensure`'s, or a job server's); a job's own lines written in ``scratch`` (default ``$TMPDIR``);
    ``user_site``: it sees ``~/.local`` too. What it made is removed if it fails.

    Raises:
        EnvBuildError: the package has no such requirements file, or they could not be installed.
    """
    requirements = os.path.join(env.folder, env.requirements)
    if not env.pip and not os.path.isfile(requirements):
        raise EnvBuildError(f"{requirements} does not exist: the package names no requirements file there")
    listed = None
    try:
        if env.pip:  # the job's own list: a file for the installer, removed after
            fd, listed = tempfile.mkstemp(prefix=".requirements-", suffix=".txt", dir=scratch)
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{line}\n" for line in env.pip))
            requirements = listed
        _create(path, user_site)
        _install(python_of(path), requirements, env.folder, out)
        with open(os.path.join(path, MARKER), "w") as f:
            json.dump({"key": env.key, "base": sys.executable, "built": time.time(), "bytes": _size(path)}, f)
        _read_only(path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # (a folder it may not remove stays, empty)
        raise
    finally:
        if listed is not None:
            with contextlib.suppress(OSError):
                os.unlink(listed)


def _size(path: str) -> int:
    """Bytes of the files under ``path``."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _read_only(path: str) -> None:
    """No write bits on a built environment: no job writes into what later jobs import."""
    for top, dirs, files in os.walk(path, topdown=False):  # the environment's own folder comes last
        entries = [os.path.join(top, n) for n in (*files, *dirs)] + ([path] if top == path else [])
        for entry in entries:
            if not stat.S_ISLNK(mode := os.lstat(entry).st_mode):
                os.chmod(entry, stat.S_IMODE(mode) & ~0o222)


def _create(path: str, user_site: bool = True) -> None:
    """A virtualenv at ``path`` that also sees this interpreter's site-packages (after its own)."""
    venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(path)
    purelib = _purelib(python_of(path))
    dirs = [*site.getsitepackages()]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE and user_site else None
    if user and os.path.isdir(user):
        dirs.append(user)
    # A line of a .pth file that starts with "import" is run: addsitedir also reads the .pth
    # files of those folders (editable installs, namespace packages).
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs if os.path.isdir(d))
    with open(os.path.join(purelib, "_tlaunch_base.pth"), "w") as f:
        f.write(lines)


def _purelib(python: str) -> str:
    """The site-packages folder of the interpreter ``python``."""
    script = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return subprocess.run([python, "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def installer() -> str:
    """What installs requirements: ``uv`` where it is on ``PATH``, else pip
    (``$TLAUNCH_ENV_INSTALLER``: ``pip`` or ``uv`` says which)."""
    chosen = os.environ.get("TLAUNCH_ENV_INSTALLER", "").strip().lower()
    if chosen in ("pip", "uv"):
        return chosen
    return "uv" if shutil.which("uv") else "pip"


def _install(python: str, requirements: str, cwd: str, out: TextIO | None) -> None:
    """Install ``requirements`` into the environment of ``python`` (see :func:`installer`)."""
    if installer() == "uv":
        uv = shutil.which("uv") or "uv"
        # uv installs what is named even when the host's Python has it (it does not look through
        # the environment's layer on the host's site-packages, as pip does): a whole environment.
        argv = [uv, "pip", "install", "--python", python, "--no-progress", "-r", requirements]
        _run_installer(argv, requirements, cwd, out, "uv pip install")
        return
    argv = [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
    argv += ["--progress-bar", "off", "-r", requirements]
    _run_installer(argv, requirements, cwd, out, "pip install")


def _run_installer(argv: list[str], requirements: str, cwd: str, out: TextIO | None, what: str) -> None:
    python = argv[0]
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as exc:
        raise EnvBuildError(f"cannot run {what} ({python}): {exc}") from None
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if out is not None:
                out.write(line)
                out.flush()
        code = proc.wait()
    except BaseException:  # stopped (SIGTERM, Ctrl-C): pip goes too
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    if code != 0:
        said = "\n".join(tail)
        hint = " (pip is not installed for this Python: install it)" if "No module named pip" in said else ""
        raise EnvBuildError(
            f"{what} -r {os.path.basename(requirements)} failed with exit code {code}{hint}",
            said,
            code,
        )


# -- on a host: python -m tlaunch.runtime.pyenv ----------------------------------------


def _ensure_command(args: argparse.Namespace) -> int:
    folder = args.folder
    unpacked = None
    try:
        if args.archive:  # the package, shipped here for the build only
            os.makedirs(args.root, mode=0o700, exist_ok=True)
            unpacked = tempfile.mkdtemp(prefix=".package-", dir=args.root)
            with tarfile.open(args.archive) as tar:
                if hasattr(tarfile, "data_filter"):  # 3.10.12+, 3.11.4+
                    tar.extractall(unpacked, filter="data")
                else:  # pragma: no cover - our own archive (tlaunch.ssh.sync.pack_dir)
                    tar.extractall(unpacked)
            folder = unpacked
        built = ensure(args.root, RuntimeEnv(folder, args.key, args.requirements), out=sys.stderr)
    except EnvBuildError as exc:
        print(f"tlaunch: {exc.summary}", file=sys.stderr)
        if args.report:
            report = {"state": "failed", "failure": exc.report(), "stop_reason": exc.summary}
            with contextlib.suppress(OSError):
                _write_json(args.report, report)
        return 1
    finally:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        if args.archive:
            with contextlib.suppress(OSError):
                os.unlink(args.archive)
    with contextlib.suppress(ImportError, OSError):  # where tlaunch is installed (not a pod's init step)
        from tlaunch.runtime.envgc import collect

        collect(args.root, MARKER)  # the environments of this host nobody used for long
    if args.shell:
        print(_activate(built))
    else:
        print(json.dumps({"python": built.python, "path": built.path, "built": built.built}))
    return 0


def _activate(built: Built) -> str:
    """Shell lines that put ``built`` first: its interpreter on ``PATH``, its packages on ``PYTHONPATH``
    (for the image's own interpreters too: ``torchrun``'s workers)."""
    purelib = _purelib(built.python)
    return "\n".join(
        [
            f"export VIRTUAL_ENV={shlex.quote(built.path)}",
            f'export PATH={shlex.quote(os.path.dirname(built.python))}:"$PATH"',
            f'export PYTHONPATH={shlex.quote(purelib)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        ]
    )


def _write_json(path: str, data: object) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".report.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: pip is killed, a half-built environment removed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tlaunch.runtime.pyenv``: see the module docstring."""
    p = argparse.ArgumentParser(prog="python -m tlaunch.runtime.pyenv", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("ensure", help="build the environment if needed; print its python")
    f = sub.add_parser("find", help=f"print its python if built (exit {NOT_BUILT} if not)")
    x = sub.add_parser("exec", help="run its python with the arguments after --")
    for each in (e, f, x):
        each.add_argument("root")
        each.add_argument("key")
    e.add_argument("folder", nargs="?", default=".")
    e.add_argument("--archive", help="a .tar.gz of the package, unpacked for the build, then deleted")
    e.add_argument("--requirements", default="requirements.txt", help="its requirements file, in FOLDER")
    e.add_argument("--report", help="on failure, write the run's failure (result.json) here")
    e.add_argument("--shell", action="store_true", help="print shell lines that activate it, not JSON")
    x.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # stopped (its job, its SSH channel): tidy up first
        signal.signal(signum, _exit_on)
    args.root = os.path.abspath(os.path.expanduser(args.root))  # its interpreter's path is used anywhere
    if args.command == "ensure":
        return _ensure_command(args)
    python = find(args.root, args.key)
    if args.command == "find":
        if python is None:
            return NOT_BUILT
        print(python)
        return 0
    if python is None:
        print(
            f"tlaunch: no runtime environment {args.key!r} under {args.root}: run ensure first",
            file=sys.stderr,
        )
        return NOT_BUILT
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    os.execv(python, [python, *rest])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
