"""A package's names imported from their modules when first asked for (PEP 562): :func:`lazy_exports`.

A process that imports a package for one name loads that name's module only:
``tlaunch.torch`` names ``SSHOptions`` on every rank without loading paramiko
(``tlaunch.backends.ssh``'s backend), a node process loads its own node type's
module only (``tlaunch.nodes``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, str], keep: MutableMapping[str, Any] | None = None
) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: each name of ``modules`` (name -> the module that defines it,
    ``.module`` relative to ``package``) imported when first asked for; kept in ``keep`` (the
    package's ``globals()``) when given.

    The function it returns raises ``AttributeError`` for any other name, as a module does.
    """

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        if keep is not None:
            keep[name] = value
        return value

    return __getattr__
