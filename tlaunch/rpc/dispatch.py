"""What an RPC call runs: a public method of the served object, its result or its error as the answer.

Only names without a leading ``_`` can be called (and ``__call__``); a name the
object lacks is refused naming the public methods it has. Whatever the method
raises goes back to the caller (``RemoteError``, with its type and traceback).
"""

from __future__ import annotations

from tlaunch.rpc import wire

__all__ = ["dispatch"]


def dispatch(target: object, buffers: list[memoryview]) -> tuple[int, list[wire.Buffer]]:
    """Run the call in ``buffers`` on ``target``: the kind of the answer (a reply, or an error the
    caller gets as ``RemoteError``) and its buffers."""
    try:
        method, args, kwargs = wire.loads(buffers)
        if not isinstance(method, str) or (method.startswith("_") and method != "__call__"):
            raise AttributeError(
                f"{method!r} is not a public method; only names without a leading '_' can be called"
            )
        fn = getattr(target, method, None)
        if fn is None or not callable(fn):
            names = (n for n in dir(target) if not n.startswith("_"))
            public = sorted(n for n in names if callable(getattr(target, n, None)))
            raise AttributeError(
                f"{type(target).__name__!r} has no public method {method!r}; "
                f"its public methods: {', '.join(public) or 'none'}"
            )
        return wire.REPLY, wire.dumps(fn(*args, **kwargs))
    except BaseException as exc:  # the caller gets it as RemoteError
        return wire.ERROR, wire.dumps(wire.error_payload(exc))
