"""The launch methods on the command line: a flag per setting, from the method table.

``tlaunchrun METHOD`` and ``tlaunch job submit`` take the settings of
:data:`tlaunch.runtime.methods.SETTINGS` as flags made here: their names,
types, defaults and help are the table's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tlaunch.runtime.methods import Setting

__all__ = ["dashed", "setting_flag"]


def dashed(p: argparse._ActionsContainer, name: str, **kw: Any) -> None:
    """``--some-name`` (and ``--some_name``, the seed's spelling) for the setting ``some_name``."""
    names = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
    p.add_argument(*names, **{"dest": name, **kw})


def setting_flag(
    p: argparse._ActionsContainer,
    setting: Setting,
    flag: Callable[..., None] = dashed,
) -> None:
    """Add ``setting``'s flag to ``p`` with ``flag(p, name, **argparse_keywords)``.

    A setting that is on unless turned off (a ``bool`` whose default is True) is ``--no-NAME``.
    """
    if isinstance(setting.default, bool) and setting.default:
        off = f"turn off: {setting.help}"
        flag(p, f"no_{setting.name}", action="store_false", dest=setting.name, help=off)
    elif isinstance(setting.default, bool):
        flag(p, setting.name, action="store_true", help=setting.help)
    elif isinstance(setting.default, int):
        flag(
            p,
            setting.name,
            type=int,
            default=setting.default,
            help=f"{setting.help} (default {setting.default})",
        )
    else:
        flag(p, setting.name, default=setting.default, help=setting.help)
