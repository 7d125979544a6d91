"""TransmitNode: a data server (queues, boards, replay tables) placed on a host."""

from __future__ import annotations

from typing import Any

from tlaunch.errors import ProgramError
from tlaunch.nodes.base import Handle, Node, NodeRuntime
from tlaunch.rpc.transmit import Table, TransmitClient, TransmitServer, tables_from

__all__ = ["Table", "TransmitNode"]


class TransmitNode(Node):
    """A transmit data server; its handle dereferences to a :class:`TransmitClient`.

    Args:
        tables: :class:`Table` objects, or a dict name -> kind (``queue``,
            ``latest``, ``replay``). The ``info`` and ``weights`` boards always exist.
        checkpoint_path: where the server saves its tables (periodically and on
            stop) and loads them at start, on its own host.
        checkpoint_every: seconds between periodic checkpoints.

    Example::

        server = program.add_node(lp.TransmitNode({"rollouts": "queue"}).to_host("host1"))
        program.add_node(lp.SSHNode(Worker, server).to_host("host2"))
        # in Worker: self.server.insert("rollouts", item); self.server.send_info({...})
    """

    def __init__(
        self, tables: Any = None, checkpoint_path: str | None = None, checkpoint_every: float = 10.0
    ) -> None:
        super().__init__()
        try:
            self._tables = tables_from(tables)
        except ValueError as exc:
            raise ProgramError(f"TransmitNode: {exc}") from exc
        if checkpoint_every <= 0:
            raise ProgramError(f"TransmitNode: checkpoint_every={checkpoint_every!r} must be > 0")
        self._checkpoint_path = checkpoint_path
        self._checkpoint_every = checkpoint_every

    @property
    def tables(self) -> list[Table]:
        """The server's tables."""
        return list(self._tables)

    @property
    def has_handle(self) -> bool:
        return True

    def create_handle(self) -> Handle:
        return Handle(self, wrap=TransmitClient)

    def execute(self, runtime: NodeRuntime) -> None:
        stop = runtime.stop_event()
        server = TransmitServer(self._tables, stop, self._checkpoint_path, self._checkpoint_every)
        stop_serving = runtime.serve(server)
        try:
            runtime.set_state("serving")
            stop.wait()
        finally:
            server.close()
            stop_serving()

    def __repr__(self) -> str:
        return f"TransmitNode(tables={[t.name for t in self._tables]})"
