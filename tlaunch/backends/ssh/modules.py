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
does more than :data:`LIMIT` of source (what stays behind is named).
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

from tlaunch.backends.nodeprocs import main_path_entry
from tlaunch.ssh.sync import mib, select, tar_files

__all__ = ["LIMIT", "LocalModules", "local_modules"]

LIMIT = 16 << 20
"""More Python source than this does not travel by itself (see :func:`local_modules`)."""
_NEVER = frozenset(
    {"__main__", "tlaunch", *sys.builtin_module_names, *getattr(sys, "stdlib_module_names", ())}
)


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
        dropped: why part of them is not shipped (empty when all are).
    """

    roots: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    compiled: tuple[str, ...] = ()
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
        if self.compiled:
            text += f"; compiled, not shipped: {', '.join(self.compiled)}"
        if self.dropped:
            text += f"; {self.dropped}"
        return text


def _installed_dirs() -> tuple[str, ...]:
    """Folders whose modules every host has: the standard library, installed packages, the interpreter's."""
    dirs = {os.path.dirname(sys.executable)}
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix})):
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts") if k in paths)
    dirs.update(getattr(site, "getsitepackages", list)())
    dirs.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


def _under(path: str, dirs: tuple[str, ...]) -> bool:
    real = os.path.realpath(path) + os.sep
    return real.startswith(dirs) or os.sep + "site-packages" + os.sep in real or "dist-packages" in real


def _python_only(folder: str, path: str, is_dir: bool) -> bool:
    """Inside a package (``folder``): its ``.py`` files and its sub-packages."""
    if is_dir:
        return os.path.isfile(os.path.join(folder, path, "__init__.py"))
    return path.endswith(".py")


def _imported(installed: tuple[str, ...]) -> Iterator[tuple[str, str, ModuleType]]:
    """(root, top-level name, module) of each module of the launcher's own from ``sys.path``."""
    on_path = {os.path.realpath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir)}
    seen: set[str] = set()
    for name, mod in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top in seen or top in _NEVER or mod is None:
            continue
        seen.add(top)
        head = sys.modules.get(top)
        where = getattr(head, "__file__", None)
        if head is None or not where or not os.path.isfile(where) or _under(where, installed):
            continue
        is_package = hasattr(head, "__path__")
        root = os.path.dirname(os.path.dirname(where) if is_package else where)
        if os.path.realpath(root) in on_path:
            yield root, top, head


def local_modules(working_dir: str | None = None, limit: int = LIMIT) -> LocalModules:
    """The launcher's own modules to ship; those of ``working_dir`` (shipped anyway) left out.

    Over ``limit`` bytes of source, the launcher's folder's modules stay behind
    first, then the largest of the imported ones, with a note (``dropped``).

    Raises:
        OSError: a folder cannot be read.
    """
    installed = _installed_dirs()
    skip_root = os.path.realpath(working_dir) if working_dir else None
    found: dict[str, tuple[str, bool, list[tuple[str, int]]]] = {}  # top -> (root, package, files)
    compiled: list[str] = []
    for root, top, mod in _imported(installed):
        if skip_root is not None and os.path.realpath(root) == skip_root:
            continue
        where = str(mod.__file__)
        if not where.endswith(".py"):
            compiled.append(top)
        elif hasattr(mod, "__path__"):
            folder = os.path.join(root, top)
            inside = select(folder, functools.partial(_python_only, folder))
            found[top] = (root, True, [(f"{top}/{p}", n) for p, n in inside.files])
        else:
            found[top] = (root, False, [(f"{top}.py", os.path.getsize(where))])
    dropped: list[str] = []
    main = main_path_entry()
    if main is not None and os.path.isdir(main) and not _under(main, installed):
        main = os.path.abspath(main)
        if skip_root is None or os.path.realpath(main) != skip_root:
            script = os.path.realpath(getattr(sys.modules.get("__main__"), "__file__", None) or main)
            taken = set(found)
            own = select(main, lambda p, d: _main_entry(main, p, d, taken, script))
            total = sum(n for _, n in own.files) + sum(n for _, _, fs in found.values() for _, n in fs)
            if total > limit:
                dropped.append(f"the Python files of {main} ({mib(total)} with the rest)")
            else:
                for path, n in own.files:
                    top, sep, _ = path.partition("/")
                    name = top.removesuffix(".py")
                    found.setdefault(name, (main, bool(sep), []))[2].append((path, n))
    size = {top: sum(n for _, n in fs) for top, (_, _, fs) in found.items()}
    while found and sum(size[t] for t in found) > limit:  # the largest stay behind first
        top = max(found, key=lambda t: size[t])
        dropped.append(f"{top} ({mib(size[top])})")
        del found[top]
    roots = tuple(dict.fromkeys(root for root, _, _ in found.values()))
    files = tuple((os.path.join(root, p), p) for root, _, fs in found.values() for p, _ in fs)
    sizes = tuple(n for _, _, fs in found.values() for _, n in fs)
    names = tuple(f"{top}/" if package else f"{top}.py" for top, (_, package, _) in found.items())
    why = ""
    if dropped:
        why = (
            f"not shipped, over {mib(limit)} of source: {', '.join(dropped)}; leave some out with a "
            ".tlaunchignore, or ship a folder with working_dir="
        )
    return LocalModules(roots, files, names, sizes, tuple(compiled), why)


def _main_entry(main: str, path: str, is_dir: bool, taken: set[str], script: str) -> bool:
    """In the launcher's folder: its top-level ``.py`` modules and packages (their ``.py`` files).

    The launcher's own script (``script``) is not one: it is ``__main__``, pickled by value.
    """
    top, _, rest = path.partition("/")
    name = top.removesuffix(".py")
    if not name.isidentifier() or name in _NEVER or name in taken:
        return False
    if not rest and not is_dir and os.path.realpath(os.path.join(main, top)) == script:
        return False
    if not rest:  # a top-level entry: a module, or a package
        return os.path.isfile(os.path.join(main, top, "__init__.py")) if is_dir else top.endswith(".py")
    return _python_only(main, path, is_dir)
