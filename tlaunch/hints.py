"""Hints for failures tlaunch recognises in a node's traceback, said with the error."""

from __future__ import annotations

import importlib.util
import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tlaunch.runtime.coordinator import NodeRecord

__all__ = ["hint"]

_MISSING = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def hint(rec: NodeRecord) -> str:
    """How to fix a failure tlaunch recognises: a module the launcher has but the node's host lacks."""
    found = _MISSING.search(rec.traceback or "")
    if found is None or rec.host in ("localhost", "127.0.0.1"):
        return ""
    name = found.group(1).split(".")[0]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or "site-packages" in origin or "dist-packages" in origin:
        return ""
    folder = os.path.dirname(os.path.dirname(origin) if origin.endswith("__init__.py") else origin)
    if not origin.endswith(".py"):  # the launcher's own .py modules travel by themselves; this one cannot
        return (
            f"module {name!r} is a compiled module on the launcher ({origin}), which does not travel "
            f"by itself: install it on host {rec.host!r} (setup=[...]), or ship its folder with "
            f"launch(..., working_dir={folder!r}) if the host can load it"
        )
    return (
        f"module {name!r} is importable on the launcher ({origin}) but not on host {rec.host!r}: "
        f"ship its folder with launch(..., working_dir={folder!r}), or install it there"
    )
