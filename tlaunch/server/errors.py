"""The job server's one error shape, for every error a request can meet.

``{"error": {"status": 404, "code": "not_found", "message": "..."}}``, never a
traceback: the server's own :class:`~tlaunch.server.deps.ApiError`, Starlette's
(404, 405 with its ``Allow``), a request that does not validate (400 naming the
field; an unknown field named, with the field meant when one is close), a client
gone mid-body, and anything unexpected (500, its traceback in the server's log only).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from tlaunch.server.deps import ApiError
from tlaunch.server.models import CODES, SubmitJob

__all__ = ["answer_errors"]

log = logging.getLogger("tlaunch.server.app")


def _extra(error: Any) -> bool:
    return bool(error.get("type") == "extra_forbidden")


def _problem(error: Any) -> str:
    """A validation error's words; an unknown field's say which were meant, and what is valid."""
    if not _extra(error):
        return str(error.get("msg", ""))
    loc = [str(p) for p in error.get("loc", ())]
    model: Any = SubmitJob
    for part in loc[1:-1]:  # a nested model: slurm, kubernetes
        field = model.model_fields.get(part)
        inner = getattr(field, "annotation", None)
        model = next((a for a in getattr(inner, "__args__", (inner,)) if hasattr(a, "model_fields")), None)
        if model is None:
            return "is not a field"
    known = sorted(model.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"is not a field ({hint}the fields are {', '.join(known)})"


def answer_errors(app: FastAPI) -> None:
    """Answer every error of ``app`` in the one shape (see the module docstring)."""

    def answer(status: int, message: str, extra: dict[str, Any] | None = None) -> JSONResponse:
        body = {
            "error": {
                "status": status,
                "code": CODES.get(status, "error"),
                "message": message,
                **(extra or {}),
            }
        }
        return JSONResponse(body, status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return answer(exc.status, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = answer(exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, whichever route serves it
            methods = set()
            for route in app.routes:
                if isinstance(route, Route) and route.path_regex.match(request.url.path):
                    methods |= set(route.methods or ())
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        return answer(400, "the client went away before its request's body was read whole")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "problem": _problem(e)}
            for e in exc.errors()
        ]
        unknown = [(p["where"].removeprefix("body."), p["problem"])
                   for p, e in zip(problems, exc.errors(), strict=True) if _extra(e)]  # fmt: skip
        if unknown:  # every one at once: a misspelt field is never dropped silently
            said = f"unknown fields {[name for name, _ in unknown]}: {unknown[0][0]} {unknown[0][1]}"
            return answer(400, said, {"problems": problems})
        first = problems[0] if problems else {"where": "", "problem": "invalid"}
        return answer(400, f"{first['where']}: {first['problem']}", {"problems": problems})

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return answer(500, f"internal error ({type(exc).__name__}); the server's log has the details")
