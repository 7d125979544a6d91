"""Run a Launchpad program with no change at all: ``launchpad`` and ``courier`` resolve to tlaunch.

From a shell::

    python -m tlaunch.compat script.py [args...]
    python -m tlaunch.compat -m package.module [args...]

or in a program or notebook, before it imports ``launchpad``::

    import tlaunch.compat
    tlaunch.compat.install()

Every module of Launchpad's public paths (:data:`tlaunch.compat.launchpad.SUBMODULES`)
is then tlaunch's, with Launchpad's defaults: ``--lp_launch_type`` defaults to
``local_mt`` (threads), as in Launchpad, where ``from tlaunch import lp_ssh``
defaults to ``local_mp``. A module under a ``launchpad`` directory that tlaunch does not
provide (the examples and tests of a Launchpad checkout) loads from that directory:
from a ``sys.path`` entry, or from the checkout that holds the script being run.
The alias is refused while dm-launchpad itself is installed: there
``import launchpad`` means the real one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from tlaunch.errors import TLaunchError
from tlaunch.flags import DEFAULT_LAUNCH_TYPE, FLAGS, LAUNCH_TYPE
from tlaunch.launch_types import LaunchType
from tlaunch.runtime.setups import register_node_setup, unregister_node_setup

__all__ = ["ALIASES", "AliasError", "install", "installed", "uninstall"]

ALIASES = {"launchpad": "tlaunch.compat.launchpad", "courier": "tlaunch.compat.courier"}
_DISTRIBUTIONS = ("dm-launchpad", "dm-launchpad-nightly")


class AliasError(TLaunchError, ImportError):
    """``launchpad`` cannot be aliased to tlaunch here."""


class _Same(importlib.abc.Loader):
    """Loads a module as the module already imported under another name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module(self.name)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when imported under its own name."""


class _Finder(importlib.abc.MetaPathFinder):
    """Finds what tlaunch does not provide under an aliased name, in the user's own ``launchpad`` dirs.

    ``from launchpad.launch import serialization_test`` asks for
    ``tlaunch.compat.launchpad.launch.serialization_test`` (the aliased package's
    real name): that is the user's ``launchpad.launch.serialization_test`` too.
    """

    def __init__(self) -> None:
        self.roots: list[str] = []  # checkouts holding the script being run

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        for alias, ours in ALIASES.items():
            if fullname.startswith(ours + "."):
                user = alias + fullname[len(ours) :]
                return importlib.util.spec_from_loader(fullname, _Same(user)) if self._user(user) else None
        return self._user(fullname)

    def _user(self, fullname: str) -> ModuleSpec | None:
        """The spec of ``fullname`` (under an alias) from the user's directories, if there is one."""
        if fullname.partition(".")[0] not in ALIASES or "." not in fullname:
            return None
        parts = fullname.split(".")[:-1]
        roots = [*self.roots, *(entry or os.getcwd() for entry in sys.path if isinstance(entry, str))]
        dirs = [d for d in (os.path.join(root, *parts) for root in roots) if os.path.isdir(d)]
        mine = os.path.dirname(os.path.abspath(__file__))
        dirs = [d for d in dict.fromkeys(dirs) if not os.path.abspath(d).startswith(mine + os.sep)]
        return importlib.machinery.PathFinder.find_spec(fullname, dirs) if dirs else None


_FINDER = _Finder()
_node_setup: Callable[[], None] | None = None


def _refuse_if_launchpad() -> None:
    for name in _DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        raise AliasError(
            f"{name} {dist.version} is installed (in {dist.locate_file('')}), so `import launchpad` "
            "is the real Launchpad here; to run this program on tlaunch, use an environment "
            f"without it (pip uninstall {name}) or change its import to `from tlaunch import lp_ssh as lp`"
        )
    for alias, target in ALIASES.items():
        present = sys.modules.get(alias)
        if present is not None and present.__name__ != target:
            raise AliasError(
                f"{alias!r} was imported before tlaunch.compat.install() (from "
                f"{getattr(present, '__file__', '?')}): call install() before anything imports it"
            )


def install(script: str | None = None, roots: Sequence[str] = ()) -> None:
    """Make ``import launchpad`` (its submodules, and ``courier``) resolve to tlaunch.

    Node processes of later launches do the same before they unpickle their node.

    Args:
        script: the file about to run; if it lies inside a ``launchpad`` directory
            (a Launchpad checkout), that checkout's other modules can be imported.
        roots: more directories that hold a ``launchpad`` directory of the user's modules.

    Raises:
        AliasError: dm-launchpad is installed, or ``launchpad`` was already imported.
    """
    global _node_setup
    _refuse_if_launchpad()
    for alias, target in ALIASES.items():
        importlib.import_module(target)
        for name, module in list(sys.modules.items()):
            if name == target or name.startswith(target + "."):
                sys.modules[alias + name[len(target) :]] = module
    if script is not None:
        here = os.path.dirname(os.path.abspath(script))
        while os.path.dirname(here) != here:
            if os.path.basename(here) == "launchpad" and os.path.dirname(here) not in _FINDER.roots:
                _FINDER.roots.append(os.path.dirname(here))
            here = os.path.dirname(here)
    _FINDER.roots.extend(r for r in roots if r not in _FINDER.roots)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    FLAGS.set_default(LAUNCH_TYPE.name, LaunchType.LOCAL_MULTI_THREADING.value)
    if _node_setup is not None:
        unregister_node_setup(_node_setup)
    _node_setup = functools.partial(_install_in_node, tuple(_FINDER.roots))
    register_node_setup(_node_setup)


def _install_in_node(roots: tuple[str, ...]) -> None:
    """A node process's set-up: the alias its launcher had."""
    if not installed():
        install(roots=roots)


def installed() -> bool:
    """Whether ``launchpad`` currently resolves to tlaunch."""
    return _FINDER in sys.meta_path


def uninstall() -> None:
    """Undo :func:`install`: forget the aliased modules and the finder."""
    global _node_setup
    FLAGS.set_default(LAUNCH_TYPE.name, DEFAULT_LAUNCH_TYPE)
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _FINDER.roots.clear()
    if _node_setup is not None:
        unregister_node_setup(_node_setup)
        _node_setup = None
    for name in list(sys.modules):
        if name.partition(".")[0] in ALIASES:
            del sys.modules[name]
