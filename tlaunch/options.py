"""The options every launch takes, whatever its backend, checked before anything starts.

:func:`tlaunch.launch` takes them typed: ``options=LaunchOptions(...)`` and one
backend's own, ``backend_options=`` a :class:`~tlaunch.backends.base.BackendOptions`
of that backend (``SSHOptions``...). Launchpad's form, every option a keyword
(``launch(p, stop_grace=1, ssh_config=...)``), is converted once, at that edge,
by :func:`typed_options`; nothing past it handles options as a dict.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tlaunch.backends import backend_names, get_backend
from tlaunch.backends.base import BackendOptions, BackendType, OutputSink
from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.restarts import RestartPolicy
from tlaunch.runtime.states import FAILURE_POLICIES

__all__ = ["LaunchOptions", "restart_policies", "typed_options"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class LaunchOptions:
    """Options of every launch (keyword arguments of :func:`tlaunch.launch`).

    Attributes:
        stop_grace: seconds nodes get to exit after a stop, before SIGTERM, then SIGKILL.
        failure_grace: the same, when a node's failure stopped the run (at most
            ``stop_grace``): the root cause is known, and the others are ended
            quickly. A node that must save state on failure does it in a stop
            handler (``register_stop_handler``: it runs as soon as the stop is
            seen) within this time, or raises it.
        resolve_timeout: how long a handle's first call waits for its node to come up.
        coordinator_timeout: a node that cannot reach its run's coordinator this
            long stops (its launcher or head is gone).
        env: extra environment variables of every node (never on a command line).
        env_patterns: names or patterns (``"WANDB_*"``) of the launcher's
            environment variables to copy to every node.
        max_restarts: restarts of a failing node: an int for all, or a dict
            label or ``label/i`` -> int.
        restart_backoff: seconds before the first restart, doubling after.
        on_failure: ``"stop"`` (default) ends the run when a node fails for good;
            ``"continue"`` lets the others go on.
        detach: leave the run going when the launcher returns (backends that can).
        output: where streamed node output goes (an object with ``line(prefix, text)``);
            default: printed with a coloured ``[prefix]``.
        debug: ``"post-mortem"``: a node that raises waits at its exception for
            ``tlaunch debug`` (bounded: ``TLAUNCH_DEBUG_TIMEOUT``, default 300 s) before
            its failure stops the run; None (default): ``$TLAUNCH_DEBUG``, else off.
    """

    stop_grace: float = 5.0
    failure_grace: float = 1.0
    resolve_timeout: float = 300.0
    coordinator_timeout: float = 15.0
    env: Mapping[str, str] | None = None
    env_patterns: list[str] = field(default_factory=list)
    max_restarts: int | Mapping[str, int] = 0
    restart_backoff: float = 1.0
    on_failure: str = "stop"
    detach: bool = False
    output: OutputSink | None = None
    debug: str | None = None

    def debug_mode(self) -> str | None:
        """``debug``, else ``$TLAUNCH_DEBUG`` (empty: off), checked.

        Raises:
            LaunchError: it is not one of :data:`~tlaunch.runtime.debugger.DEBUG_MODES`.
        """
        from tlaunch.runtime.debugger import DEBUG_MODES

        given = self.debug if self.debug is not None else os.environ.get("TLAUNCH_DEBUG") or None
        if given is not None and given not in DEBUG_MODES:
            where = "debug" if self.debug is not None else "$TLAUNCH_DEBUG"
            raise LaunchError(
                f"{where}={given!r} is not a debug mode: use one of {list(DEBUG_MODES)} "
                "(breakpoint() needs none: it always pauses its node for `tlaunch debug`)"
            )
        return given

    def check(self) -> None:
        """Raise :class:`LaunchError` for a bad value."""
        self.debug_mode()
        if self.on_failure not in FAILURE_POLICIES:
            raise LaunchError(f"on_failure={self.on_failure!r} is not one of {list(FAILURE_POLICIES)}")
        for name in ("stop_grace", "failure_grace", "restart_backoff"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise LaunchError(f"{name}={value!r} must be a number >= 0")
        for name in ("resolve_timeout", "coordinator_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise LaunchError(f"{name}={value!r} must be a number > 0")
        if isinstance(self.env_patterns, str):
            raise LaunchError(
                f"env_patterns={self.env_patterns!r} must be a list of patterns, e.g. ['WANDB_*']"
            )
        for key, value in (self.env or {}).items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                raise LaunchError(
                    f"env key {key!r} is not a valid variable name; use letters, digits and '_', "
                    "not starting with a digit (e.g. env={'MY_VAR': 'value'})"
                )
            if not isinstance(value, str) or "\0" in value:
                raise LaunchError(f"env[{key!r}]={value!r} must be a str without NUL characters")

    def node_env(self) -> dict[str, str]:
        """Every node's environment: the launcher's variables matching ``env_patterns``, then ``env``."""
        out = {
            k: v for k, v in os.environ.items() if any(fnmatch.fnmatchcase(k, p) for p in self.env_patterns)
        }
        out.update(self.env or {})
        debug = self.debug_mode()
        if debug is not None:  # node processes (and what they start: torch workers) read it
            out["TLAUNCH_DEBUG"] = debug
        return out


def typed_options(
    kind: BackendType,
    given: Mapping[str, Any],
    options: LaunchOptions | None = None,
    backend_options: BackendOptions | None = None,
) -> tuple[LaunchOptions, BackendOptions]:
    """The launch's typed options: ``options`` and ``backend_options`` (of ``kind``) as given, with the
    keyword arguments ``given`` (Launchpad's form: common options and ``kind``'s own by name) over them.

    Raises:
        LaunchError: a bad value; ``backend_options`` of another backend; an option ``kind`` does
            not take (naming the launch type that does).
    """
    names = {f.name for f in dataclasses.fields(LaunchOptions)}
    common = dataclasses.replace(options or LaunchOptions(), **{k: v for k, v in given.items() if k in names})
    common.check()
    own = {k: v for k, v in given.items() if k not in names}
    if backend_options is not None:
        if not isinstance(backend_options, kind.Options):
            raise LaunchError(
                f"backend_options={type(backend_options).__name__}(...) are not launch_type {kind.name!r}'s; "
                f"give {kind.Options.__name__}(...)"
            )
        own = {
            **{f.name: getattr(backend_options, f.name) for f in dataclasses.fields(backend_options)},
            **own,
        }
    try:
        return common, kind.Options.from_kwargs(own, kind.name)
    except LaunchError:
        for name in backend_names():
            other = get_backend(name)
            fields = set(getattr(other.Options, "__dataclass_fields__", {}))
            if other is not kind and own and set(own) <= fields:
                raise LaunchError(
                    f"options {sorted(own)} belong to launch_type {name!r}, not to {kind.name!r}; "
                    f"drop them, or launch with launch_type={name!r}"
                ) from None
        raise


def restart_policies(plan: LaunchPlan, options: LaunchOptions) -> dict[str, RestartPolicy]:
    """The restart policy of each node of ``plan``, by key.

    Raises:
        LaunchError: a negative count, or a name that is neither a label nor a node.
    """
    value = options.max_restarts
    backoff = float(options.restart_backoff)
    if isinstance(value, bool) or not isinstance(value, (int, Mapping)):
        raise LaunchError(f"max_restarts={value!r} must be an int, or a dict of label or 'label/i' -> int")
    if isinstance(value, int):
        if value < 0:
            raise LaunchError(f"max_restarts={value} must be >= 0")
        return {n.key: RestartPolicy(max(value, n.restarts_hint), backoff) for n in plan.nodes}
    labels = {n.label for n in plan.nodes}
    keys = {n.key for n in plan.nodes}
    bad = sorted(k for k in value if k not in labels and k not in keys)
    if bad:
        raise LaunchError(
            f"max_restarts names {bad}, which are neither labels nor nodes of the program; "
            f"labels: {sorted(labels)}"
        )
    negative = sorted(k for k, v in value.items() if not isinstance(v, int) or v < 0)
    if negative:
        raise LaunchError(f"max_restarts for {negative} must be ints >= 0")
    return {
        n.key: RestartPolicy(max(int(value.get(n.key, value.get(n.label, 0))), n.restarts_hint), backoff)
        for n in plan.nodes
    }
