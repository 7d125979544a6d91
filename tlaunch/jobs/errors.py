"""The job server client's error."""

from __future__ import annotations

from tlaunch.errors import TLaunchError

__all__ = ["JobServerError"]


class JobServerError(TLaunchError):
    """The job server refused a request (``status``: its HTTP status; the message is the server's)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        """The HTTP status of the answer (0: the server could not be reached)."""
