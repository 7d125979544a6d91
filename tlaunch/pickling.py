"""cloudpickle as tlaunch uses it: code pickled by value keeps the file it came from.

cloudpickle 3.1.3 names the code of every function it pickles by value
``<dynamic-code>`` (it keeps payloads deterministic). A node's or a rank's
traceback then says ``File "<dynamic-code>", line 12`` with no source line, and
the root cause loses what the user needs most. tlaunch's pickler puts the real
file name back; where that file exists on the node's host (a shared home, a
shipped working directory), Python shows the source lines as usual.
"""

from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

__all__ = ["Pickler", "dumps"]

_DYNAMIC = "<dynamic-code>"
_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_with_its_file(code: types.CodeType) -> Any:
    """cloudpickle's reduction of ``code``, with ``co_filename`` as it was."""
    constructor, args = _code_reduce(code)
    args = tuple(code.co_filename if type(a) is str and a == _DYNAMIC else a for a in args)
    return constructor, args


class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """``cloudpickle.Pickler`` whose by-value code keeps its file name (see the module docstring)."""

    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _code_with_its_file}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: object, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``cloudpickle.dumps`` with :class:`Pickler`."""
    buffer = io.BytesIO()
    Pickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()
