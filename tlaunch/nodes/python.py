"""Python nodes: a function (PyNode) or an object with an optional run() (PyClassNode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

from tlaunch.nodes.base import Handle, Node, NodeRuntime, dereference_all, find_handles

__all__ = ["PyClassNode", "PyNode", "SSHNode"]

P = ParamSpec("P")
R = TypeVar("R")


class PyNode(Node, Generic[P, R]):
    """Runs ``fn(*args, **kwargs)`` in its own process; the node is done when it returns.

    Handles anywhere in the arguments become clients before ``fn`` is called.
    """

    _args: tuple[Any, ...]
    _kwargs: dict[str, Any]

    def __init__(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"PyNode needs a callable, got {fn!r}")
        self._fn = fn
        self._args = args
        self._kwargs = kwargs

    @property
    def function(self) -> Callable[..., Any]:
        """The wrapped callable."""
        return self._fn

    def input_handles(self) -> list[Handle]:
        return find_handles((self._args, self._kwargs))

    @property
    def _input_handles(self) -> list[Handle]:
        """The handles in the arguments (Launchpad's attribute)."""
        return self.input_handles()

    def _call(self, runtime: NodeRuntime) -> Any:
        args, kwargs = dereference_all((self._args, self._kwargs), runtime)
        return self._fn(*args, **kwargs)

    def execute(self, runtime: NodeRuntime) -> None:
        runtime.set_state("running")
        self._call(runtime)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self._fn, '__qualname__', self._fn)!r})"


class PyClassNode(PyNode[P, R]):
    """Builds ``ctor(*args, **kwargs)`` in the node process and calls its ``run()``.

    An object without ``run()`` (or after :meth:`disable_run`) is kept alive until
    the program stops.
    """

    def __init__(self, ctor: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> None:
        super().__init__(ctor, *args, **kwargs)
        self._run_disabled = False

    def disable_run(self) -> None:
        """Do not call ``run()`` even if the object has one."""
        self._run_disabled = True

    def enable_run(self) -> None:
        """Call ``run()`` again when the object has one (the default)."""
        self._run_disabled = False

    def _build(self, runtime: NodeRuntime) -> tuple[Any, Callable[[], Any] | None]:
        obj = self._call(runtime)
        run = None if self._run_disabled else getattr(obj, "run", None)
        return obj, run if callable(run) else None

    def execute(self, runtime: NodeRuntime) -> None:
        _obj, run = self._build(runtime)
        self._run_or_serve(runtime, run)

    @staticmethod
    def _run_or_serve(runtime: NodeRuntime, run: Callable[[], Any] | None) -> None:
        """Call the object's ``run()`` (state ``running``), or, without one, keep it alive until the
        program stops (state ``serving``)."""
        if run is not None:
            runtime.set_state("running")
            run()
        else:
            runtime.set_state("serving")
            runtime.stop_event().wait()


class SSHNode(PyClassNode[P, R]):
    """A :class:`PyClassNode` meant for a remote host (``.to_host(...)``), as in the seed."""
