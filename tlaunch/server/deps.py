"""What every route of the job server shares: its error, and the user of a request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from tlaunch.server.auth import User, Users

__all__ = ["NO_TOKEN", "ApiError", "Auth", "current_user", "still_valid", "user_of"]

NO_TOKEN = "give a valid token: Authorization: Bearer <token> ($TLAUNCH_TOKEN for clients)"


class ApiError(Exception):
    """An answer other than 2xx, in the one error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def current_user(request: Request) -> User:
    """The user of the request's bearer token (every request is an admin's when the server has none).

    A coroutine: it runs on the event loop, never waiting for a worker thread.

    Raises:
        ApiError: 401, no valid token.
    """
    user = user_of(request)
    if user is None:
        raise ApiError(401, NO_TOKEN)
    return user


def user_of(conn: HTTPConnection) -> User | None:
    """The user of a request's (or a WebSocket handshake's) bearer token; None: no valid token.

    Every request is an admin's when the server has no tokens. The user and token are kept in
    ``conn.state`` (the access log's user; a stream checks its token again when they change).
    """
    users: Users = conn.app.state.settings.users
    if not users.required:
        conn.state.user = "admin"
        return User("admin", admin=True)
    scheme, _, token = conn.headers.get("authorization", "").partition(" ")
    user = users.check(token.strip()) if scheme.lower() == "bearer" else None
    if user is None:
        return None
    conn.state.user = user.name
    conn.state.token = token.strip()
    conn.state.users_seen = users.generation
    return user


def still_valid(request: HTTPConnection, user: User) -> bool:
    """Whether the token of ``request`` (which gave ``user``) is still accepted, as ``user``.

    Cheap when the tokens have not changed since it was last asked; a stream asks this
    between its events, so a revoked token ends it.
    """
    users: Users = request.app.state.settings.users
    if not users.required or getattr(request.state, "users_seen", None) == users.generation:
        return True
    request.state.users_seen = users.generation
    return users.check(getattr(request.state, "token", "")) == user


Auth = Annotated[User, Depends(current_user)]
