"""Addresses a node listens at, fixed before it runs (Launchpad's ``lp.Address``).

tlaunch's own nodes do not need them: a server binds a free port and tells the
run's coordinator, and handles find it there. These are for programs written
against Launchpad's addressing: ``Address()``, ``node.allocate_address()``,
``address.resolve()`` inside the node, ``get_port_from_address``. A local
launch binds every allocated address to a free port on this machine before
any node starts; a test binds them itself (``address_builder.bind_addresses``).
"""

from __future__ import annotations

import abc
import logging
import os
import re
import socket
from typing import Any

__all__ = ["AbstractAddressBuilder", "Address", "SimpleLocalAddressBuilder", "get_port_from_address"]

log = logging.getLogger(__name__)

_NAME = r"[a-z][a-z0-9]*"  # compiled (and cached by re) where first used: not as a node imports this


class AbstractAddressBuilder(metaclass=abc.ABCMeta):
    """Makes the address string of an :class:`Address`, once it runs."""

    @abc.abstractmethod
    def build(self) -> str:
        """The address, as ``host:port``."""


class SimpleLocalAddressBuilder(AbstractAddressBuilder):
    """``localhost:PORT``, with a port that is free on this machine when the builder is made."""

    def __init__(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            self._address = f"localhost:{s.getsockname()[1]}"

    def build(self) -> str:
        return self._address


class Address:
    """A network address of a node, resolved at run time (see the module docstring).

    Attributes:
        name: an optional name (lower-case letters and digits).
    """

    def __init__(self, name: str | None = None) -> None:
        if name is not None and not re.fullmatch(_NAME, name):
            raise ValueError(f"Wrong address name: {name} does not match {_NAME}.")
        self.name = name
        self._builder: AbstractAddressBuilder | None = None
        self._owner: Any = None

    @property
    def bound(self) -> bool:
        """Whether a builder has been given (the address can be resolved)."""
        return self._builder is not None

    def bind(self, builder: AbstractAddressBuilder) -> None:
        """Give the builder that makes the address when it is resolved."""
        self._builder = builder

    def resolve(self) -> str:
        """The address as ``host:port``.

        Raises:
            RuntimeError: it was never assigned to a node, or never bound.
        """
        if self._builder is None:
            if self._owner is None:
                raise RuntimeError(
                    "The lp.Address hasn't been assigned to any node, thus it cannot be resolved. "
                    "Use `address.assign(node)` (or `node.allocate_address(address)`)"
                )
            raise RuntimeError(
                f"The lp.Address of node {self._owner} has not been bound to any address builder: "
                "a local launch binds it; in a test, bind it yourself with "
                "`address_builder.bind_addresses([node])`"
            )
        return self._builder.build()

    def assign(self, node: Any) -> None:
        """Make ``node`` the owner of this address (once)."""
        if self._owner is not None:
            if self._owner is node:
                log.warning("an lp.Address is assigned twice to the same node %r", node)
                return
            raise ValueError(
                "You are associating a node to this lp.Address which is already assigned to another "
                f"node: {node} and {self._owner}"
            )
        self._owner = node
        node.addresses.append(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if not isinstance(self._owner, str):  # a launch-time check only: not shipped with the node
            state["_owner"] = f"(a node, before pickling: {self._owner!r})"
        return state


def get_port_from_address(address: str) -> int:
    """The port of ``host:port``, or of a named port (``host:name``, from ``$LP_PORT_name``)."""
    port = address.rsplit(":", maxsplit=1)[-1]
    if port.isdigit():
        return int(port)
    return int(os.environ["LP_PORT_" + port])
