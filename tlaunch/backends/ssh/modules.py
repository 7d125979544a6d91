"""The launcher's own Python modules, which travel to SSH hosts by themselves.

A node's code often imports a helper module that lives beside the script or
the notebook, not in an installed package; a host has no such file. Without
being asked, an SSH launch ships the Python source of:

1. every module the launcher has imported from outside the standard library
   and the installed packages (site-packages, the interpreter's folders) and
   tlaunch itself, from a folder on ``sys.path``: its file, or its top-level
   package's ``.py`` files;
2. the ``.py`` modules and packages of the launcher's own folder (the
   script's folder; the working directory for a notebook, ``-c`` or ``-m``),
   imported or not, since a node may import them by name.

They go in one small tar (``.gitignore``/``.tlaunchignore`` honoured) to
``~/.tlaunch/runs/<id>/modules`` on each host, on the nodes' ``PYTHONPATH``
after the working directory. Compiled extension modules cannot travel (they
are built for this machine); a node that imports one fails with a hint. Names
of the standard library never travel (they would shadow it on the hosts), nor
does more than :data:`LIMIT` of source (what stays behind is named). A module
travels only where its name, its ``__spec__`` and its file agree
(:mod:`tlaunch.backends.ssh.origins`: ``__mp_main__``, aliases, zip imports...):
the others are named in the launch's summary, never a missing file.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

from tlaunch.backends.nodeprocs import main_path_entry
from tlaunch.backends.ssh.origins import NEVER, Source, installed_dirs, origins, under
from tlaunch.ssh.sync import mib, select, tar_files

__all__ = ["LIMIT", "LocalModules", "local_modules"]

LIMIT = 16 << 20
"""More Python source than this does not travel by itself (see :func:`local_modules`)."""


@dataclass(frozen=True)
class LocalModules:
    """The launcher's own modules (see the module docstring).

    Attributes:
        roots: the folders on ``sys.path`` they come from (absolute): the
            ``PYTHONPATH`` of hosts that share this machine's filesystem.
        files: (absolute path, name in the tar) of each file to ship.
        names: the top-level modules and packages (``helper.py``, ``mypkg/``).
        sizes: the size of each file, in bytes.
        compiled: compiled modules that cannot travel.
        unshippable: ``name (why)`` of the other modules of the launcher's own
            that cannot travel by their name (an alias, a zip import: see
            :mod:`tlaunch.backends.ssh.origins`).
        dropped: why part of them is not shipped (empty when all are).
    """

    roots: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    compiled: tuple[str, ...] = ()
    unshippable: tuple[str, ...] = ()
    dropped: str = ""

    @property
    def total(self) -> int:
        """Bytes of source."""
        return sum(self.sizes)

    def pack(self, prefix: str = "") -> bytes:
        """The files as tar blocks (:func:`~tlaunch.ssh.sync.tar_files`), under ``prefix``."""
        return tar_files(self.files, prefix)

    def summary(self) -> str:
        """``helper.py, mypkg/ (4 files, 12.0 KiB)``, and what stays behind."""
        shown = ", ".join(self.names[:6]) + (
            f" and {len(self.names) - 6} more" if len(self.names) > 6 else ""
        )
        text = f"{shown} ({len(self.files)} file{'s' * (len(self.files) != 1)}, {mib(self.total)})"
        if not self.files:
            text = "none shipped"
        if self.compiled:
            text += f"; compiled, not shipped: {', '.join(self.compiled)}"
        if self.unshippable:
            text += f"; not shipped: {', '.join(self.unshippable)}"
        if self.dropped:
            text += f"; {self.dropped}"
        return text


def _python_only(folder: str, path: str, is_dir: bool) -> bool:
    """Inside a package (``folder``): its ``.py`` files and its sub-packages."""
    if is_dir:
        return os.path.isfile(os.path.join(folder, path, "__init__.py"))
    return path.endswith(".py")


def _namespace_only(path: str, is_dir: bool) -> bool:
    """Inside a namespace package's folder: its ``.py`` files and the folders below (packages or not)."""
    return os.path.basename(path.rstrip("/")).isidentifier() if is_dir else path.endswith(".py")


def _on_path() -> frozenset[str]:
    return frozenset(os.path.realpath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir))


def local_modules(working_dir: str | None = None, limit: int = LIMIT) -> LocalModules:
    """The launcher's own modules to ship; those of ``working_dir`` (shipped anyway) left out.

    Only modules whose name, ``__spec__`` and file agree are shipped
    (:mod:`tlaunch.backends.ssh.origins`); the others are named. Over ``limit``
    bytes of source, the launcher's folder's modules stay behind first, then
    the largest of the imported ones, with a note (``dropped``).

    Raises:
        OSError: a folder cannot be read.
    """
    installed = installed_dirs()
    skip_root = os.path.realpath(working_dir) if working_dir else None
    found: dict[str, _Unit] = {}  # top-level name -> what of it travels
    seen = origins(sys.modules, installed, _on_path())
    for source in seen.sources:
        if skip_root is not None and os.path.realpath(source.root) == skip_root:
            continue
        unit = found.setdefault(source.top, _Unit(source.kind != "module"))
        unit.add(source)
    dropped: list[str] = []
    main = _launchers_folder()
    if main is not None and os.path.isdir(main) and not under(main, installed):
        main = os.path.abspath(main)
        if skip_root is None or os.path.realpath(main) != skip_root:
            script = os.path.realpath(getattr(sys.modules.get("__main__"), "__file__", None) or main)
            taken = set(found)
            own = select(main, lambda p, d: _main_entry(main, p, d, taken, script))
            total = sum(n for _, n in own.files) + sum(u.total for u in found.values())
            if total > limit:
                dropped.append(f"the Python files of {main} ({mib(total)} with the rest)")
            else:
                for path, n in own.files:
                    top, sep, _ = path.partition("/")
                    unit = found.setdefault(top.removesuffix(".py"), _Unit(bool(sep)))
                    unit.put(main, path, n)
    while found and sum(u.total for u in found.values()) > limit:  # the largest stay behind first
        top = max(found, key=lambda t: found[t].total)
        dropped.append(f"{top} ({mib(found[top].total)})")
        del found[top]
    why = ""
    if dropped:
        why = (
            f"not shipped, over {mib(limit)} of source: {', '.join(dropped)}; leave some out with a "
            ".tlaunchignore, or ship a folder with working_dir="
        )
    units = list(found.values())
    return LocalModules(
        roots=tuple(dict.fromkeys(r for u in units for r in u.roots)),
        files=tuple((full, name) for u in units for full, name, _ in u.files),
        names=tuple(f"{top}/" if u.package else f"{top}.py" for top, u in found.items()),
        sizes=tuple(n for u in units for _, _, n in u.files),
        compiled=seen.compiled,
        unshippable=seen.unshippable,
        dropped=why,
    )


class _Unit:
    """The files of one top-level name (a namespace package's may come from several folders)."""

    def __init__(self, package: bool) -> None:
        self.package = package
        self.roots: list[str] = []
        self.files: list[tuple[str, str, int]] = []  # (absolute path, name in the tar, bytes)
        self._names: set[str] = set()

    @property
    def total(self) -> int:
        return sum(n for _, _, n in self.files)

    def put(self, root: str, name: str, size: int) -> None:
        """``root/name``, unless a folder earlier on ``sys.path`` gave that name (Python imports that one)."""
        if name not in self._names:
            self._names.add(name)
            self.roots += [root] if root not in self.roots else []
            self.files.append((os.path.join(root, name), name, size))

    def add(self, source: Source) -> None:
        top = source.top
        if source.kind == "module":
            self.put(source.root, f"{top}.py", os.path.getsize(os.path.join(source.root, f"{top}.py")))
            return
        folder = os.path.join(source.root, top)
        keep = functools.partial(_python_only, folder) if source.kind == "package" else _namespace_only
        for path, n in select(folder, keep).files:
            self.put(source.root, f"{top}/{path}", n)


def _launchers_folder() -> str | None:
    """The launcher's own folder (:func:`main_path_entry`); none when the launcher is an entry point
    of tlaunch's own (``python -m tlaunch....``: a job server's job, a batch job), whose working
    directory is its starter's (the server's), not a user's folder of modules."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.partition(".")[0] == "tlaunch":
        return None
    return main_path_entry()


def _main_entry(main: str, path: str, is_dir: bool, taken: set[str], script: str) -> bool:
    """In the launcher's folder: its top-level ``.py`` modules and packages (their ``.py`` files).

    The launcher's own script (``script``) is not one: it is ``__main__``, pickled by value.
    """
    top, _, rest = path.partition("/")
    name = top.removesuffix(".py")
    if not name.isidentifier() or name in NEVER or name in taken:
        return False
    if not rest and not is_dir and os.path.realpath(os.path.join(main, top)) == script:
        return False
    if not rest:  # a top-level entry: a module, or a package
        return os.path.isfile(os.path.join(main, top, "__init__.py")) if is_dir else top.endswith(".py")
    return _python_only(main, path, is_dir)
