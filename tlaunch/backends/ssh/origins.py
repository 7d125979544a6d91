"""Where each entry of ``sys.modules`` comes from, and whether it can travel by its name.

A module of the launcher's own travels to the SSH hosts
(:mod:`tlaunch.backends.ssh.modules`) as the file its name names: ``helper`` as
``<root>/helper.py``, ``pkg.core`` inside ``<root>/pkg/``, ``<root>`` a folder
on ``sys.path``. That holds only where the entry's name, the module's
``__spec__`` and its file agree, and many entries are not like that. None of
them may turn into a path to a file that is not there (``import torch`` adds
``__mp_main__``, an alias of ``__main__``, which once became
``<script's folder>/__mp_main__.py`` and a crash):

==============================================  ==========================================
entry                                           verdict
==============================================  ==========================================
``__mp_main__`` (torch, multiprocessing), the   nothing to ship: the script is pickled
launcher's script under any other name          by value
the standard library, installed packages,       nothing to ship: every host has them
built-in and frozen modules (the interpreter's)
a module made in memory (no file)               nothing to ship; named if it holds code
                                                (``import name`` fails on the hosts)
an alias (``sys.modules["cfg"] = helper``)      named; ``helper`` goes by its own name
a file whose name is not the module's           named
(``spec_from_file_location("x", "other.py")``)
from a folder not on ``sys.path``, gone since   named
imported, or without an import spec
from a zip archive                              named
compiled (``.so``; ``.pyc`` alone)              compiled: named (built for this machine)
a namespace package (no ``__init__.py``)        ships: each of its folders on ``sys.path``
==============================================  ==========================================

"Named" is what the launch's one-line summary says of what stays behind;
nothing here raises.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
import zipimport
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["NEVER", "Origins", "Source", "installed_dirs", "origins", "under"]

NEVER = frozenset(
    {"__main__", "tlaunch", *sys.builtin_module_names, *getattr(sys, "stdlib_module_names", ())}
)
"""Top-level names that never travel (the standard library would be shadowed on the hosts)."""

_SUFFIXES = tuple(sorted(importlib.machinery.all_suffixes(), key=len, reverse=True))


@dataclass(frozen=True)
class Source:
    """A top-level module or package that can travel: ``<root>/<top>.py`` or ``<root>/<top>/``.

    Attributes:
        root: the folder on ``sys.path`` it is imported from.
        top: its top-level name.
        kind: ``module`` (a file), ``package`` (with ``__init__.py``), or
            ``namespace`` (one folder of a namespace package).
    """

    root: str
    top: str
    kind: Literal["module", "package", "namespace"]


@dataclass(frozen=True)
class Origins:
    """What of ``sys.modules`` is the launcher's own (see the module docstring).

    Attributes:
        sources: what can travel, in the order first imported.
        compiled: names of compiled modules of the launcher's own (they cannot travel).
        unshippable: ``name (why)`` of each other entry of its own that cannot travel.
    """

    sources: tuple[Source, ...] = ()
    compiled: tuple[str, ...] = ()
    unshippable: tuple[str, ...] = ()


def installed_dirs() -> tuple[str, ...]:
    """Folders whose modules every host has: the standard library, installed packages, the interpreter's."""
    import site
    import sysconfig

    dirs = {os.path.dirname(sys.executable)}
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix})):
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts") if k in paths)
    dirs.update(getattr(site, "getsitepackages", list)())
    dirs.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(d) + os.sep for d in dirs if d))


def under(path: str, dirs: tuple[str, ...]) -> bool:
    """Whether ``path`` lies in one of ``dirs`` (:func:`installed_dirs`) or in any site-packages."""
    real = os.path.realpath(path) + os.sep
    return real.startswith(dirs) or os.sep + "site-packages" + os.sep in real or "dist-packages" in real


_Verdict = list[Source] | str | None  # sources; "why not" ("" for compiled); None: nothing to ship
_COMPILED = ""


def origins(modules: Mapping[str, object], installed: tuple[str, ...], on_path: frozenset[str]) -> Origins:
    """Classify ``modules`` (``sys.modules``); ``on_path``: the real paths of ``sys.path``'s folders.

    The entries of one top-level name are judged by its head first: when it is
    not the launcher's own (installed, say), none of its entries is.
    """
    main = modules.get("__main__")
    keys_of: dict[str, list[str]] = {}
    for key in list(modules):
        top = key.partition(".")[0]
        if top not in NEVER:
            keys_of.setdefault(top, []).append(key)
    sources: list[Source] = []
    compiled: list[str] = []
    named: list[str] = []

    def judge(key: str, verdict: _Verdict) -> list[Source]:
        if verdict == _COMPILED:
            compiled.append(key)
        elif isinstance(verdict, str):
            named.append(f"{key} ({verdict})")
        return verdict if isinstance(verdict, list) else []

    for top, keys in keys_of.items():
        head = modules.get(top)
        if head is None:  # submodules whose package is not (or no longer) imported
            for key in keys:
                if _verdict(key, modules[key], main, installed, on_path) is not None:
                    named.append(f"{key} (its package {top} is not imported)")
            continue
        found = judge(top, _verdict(top, head, main, installed, on_path))
        sources += found
        roots = {s.root for s in found}
        for key in keys if found else ():
            if key == top:
                continue
            inner = judge(key, _verdict(key, modules[key], main, installed, on_path))
            outside = [s.root for s in inner if s.root not in roots]
            if outside:
                named.append(f"{key} (from {outside[0]}, outside the folder of {top})")
    return Origins(tuple(sources), tuple(compiled), tuple(named))


def _verdict(
    key: str, mod: object, main: object, installed: tuple[str, ...], on_path: frozenset[str]
) -> _Verdict:
    """What entry ``key`` of ``sys.modules`` ships (see :data:`_Verdict`)."""
    if mod is main:  # __mp_main__, or the script under another name: pickled by value
        return None
    attrs = getattr(mod, "__dict__", None)
    if not isinstance(attrs, dict):
        return None  # not a module: nothing on disk
    spec = attrs.get("__spec__")
    if not isinstance(spec, importlib.machinery.ModuleSpec):
        spec = None
    file = attrs.get("__file__")
    file = file if isinstance(file, str) and file else None
    if spec is not None and spec.origin in ("built-in", "frozen"):
        return None  # in the interpreter every host runs
    if spec is not None and isinstance(spec.loader, zipimport.zipimporter):
        archive = str(spec.loader.archive)
        return None if under(archive, installed) else f"from the zip archive {archive}"
    portions = _portions(spec) if file is None else []
    origin = spec.origin if spec is not None and spec.has_location else None
    located = portions or [w for w in (file or origin,) if w]
    if not located:  # made in memory
        return "made in memory, no file" if _holds_code(key, attrs) else None
    if all(under(w, installed) for w in located):
        return None
    if spec is None:
        return f"no import spec: made by hand from {located[0]}"
    if spec.name != key:
        return f"an alias of {spec.name}"
    if attrs.get("__name__") != key:
        return f"its __name__ is {attrs.get('__name__')!r}"
    top = key.partition(".")[0]
    if portions:
        found = []
        for portion in (p for p in located if not under(p, installed)):
            root = _root(key, portion)
            if root is None or os.path.realpath(root) not in on_path:
                return f"a namespace package's folder {portion}, not on sys.path as {key}"
            found.append(Source(root, top, "namespace"))
        return found
    if file is None or file != spec.origin:
        return f"its __file__ {file} is not its spec's origin {spec.origin}"
    if not os.path.isfile(file):
        return f"its file {file} is gone"
    is_package = spec.submodule_search_locations is not None
    root = _root(key + ".__init__" if is_package else key, _without_suffix(file))
    if root is None:
        return f"loaded from {file}, which is not named {key}"
    if os.path.realpath(root) not in on_path:
        return f"loaded from {root}, which is not on sys.path"
    if not file.endswith(".py"):
        return _COMPILED
    return [Source(root, top, "package" if is_package else "module")]


def _portions(spec: importlib.machinery.ModuleSpec | None) -> list[str]:
    """The folders of a namespace package (none for anything else)."""
    if spec is None or spec.origin is not None or spec.submodule_search_locations is None:
        return []
    return [str(p) for p in spec.submodule_search_locations]


def _without_suffix(file: str) -> str:
    """``/r/pkg/mod`` of ``/r/pkg/mod.py`` (or ``.cpython-311-x86_64-linux-gnu.so``, ``.pyc``)."""
    for suffix in _SUFFIXES:
        if file.endswith(suffix):
            return file[: -len(suffix)]
    return file + "\0"  # no module suffix: matches no name


def _root(key: str, path: str) -> str | None:
    """The folder that ``path`` (without suffix) is ``key`` in: ``/r`` of ``pkg.mod``, ``/r/pkg/mod``."""
    tail = os.sep + os.path.join(*key.split("."))
    return path[: -len(tail)] if path.endswith(tail) else None


def _holds_code(key: str, attrs: Mapping[str, object]) -> bool:
    """Whether a module made in memory defines Python functions, or classes with Python methods.

    Code a node may need; the types that compiled modules make in memory
    (Cython's ``_cython_3_3_1``, say) are not.
    """
    for value in attrs.values():
        if getattr(value, "__module__", None) != key:
            continue
        if isinstance(value, types.FunctionType):
            return True
        if isinstance(value, type) and any(isinstance(v, types.FunctionType) for v in vars(value).values()):
            return True
    return False
