"""What the pool of SSH hosts raises::

TLaunchError
└── PoolError                  the pool cannot do what was asked
    ├── PoolConfigError        pool.yaml is wrong (the message names the key, the value, the fix)
    ├── NeverFits              a job asks for more than the pool has (the server's 400)
    └── HoldingConflict        a resource would be given to two jobs at once (a bug; never silent)
"""

from __future__ import annotations

from tlaunch.errors import TLaunchError

__all__ = ["HoldingConflict", "NeverFits", "PoolConfigError", "PoolError"]


class PoolError(TLaunchError):
    """The pool of hosts cannot do what was asked."""


class PoolConfigError(PoolError, ValueError):
    """The pool's description (``pool.yaml``) is wrong; the message names where and how to fix it."""


class NeverFits(PoolError, ValueError):
    """A job asks for more than the pool has, or than its user may hold: it would wait forever."""


class HoldingConflict(PoolError, RuntimeError):
    """A GPU or CPU would be held by two jobs at once (refused: the holdings stay as they were)."""
