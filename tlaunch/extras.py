"""Optional parts (``pip install 'tlaunch[extra]'``): imported when used, a one-line hint if missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from tlaunch.errors import LaunchError

__all__ = ["EXTRAS", "MissingExtraError", "require"]

EXTRAS = {
    "yaml": "k8s",
    "kubernetes": "k8s",
    "kopf": "k8s",
    "torch": "torch",
    "deepspeed": "deepspeed",
    "fastapi": "server",
    "uvicorn": "server",
    "httpx": "server",
    "psycopg": "postgres",
}
"""The extra of each optional module (``pyproject.toml``'s ``[project.optional-dependencies]``)."""


class MissingExtraError(LaunchError, ImportError):
    """An optional part of tlaunch is used but its extra is not installed (the message says which)."""


def require(module: str, what: str) -> ModuleType:
    """``module``, imported; ``what`` is what needs it (``"tlaunchrun -o yaml"``).

    Raises:
        MissingExtraError: it is not installed; the message names the extra to install.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".", maxsplit=1)[0]
        extra = EXTRAS.get(top)
        how = f"pip install 'tlaunch[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtraError(f"{what} needs {top}, which is not installed: {how} ({exc})") from None
