"""Concurrent HTTP clients for the server benches: many clients, spread over a few processes.

``load(url, requests, clients=50, seconds=10)`` runs ``clients`` clients, each
an ``httpx.Client`` of its own (its own kept-alive connection) in a thread,
the threads spread over ``processes`` processes so that the clients'
interpreter lock is not what is measured; every client of every process
begins at the same moment. Each client sends the requests of
``requests`` in turn, as fast as it gets answers, until ``seconds`` pass (or,
with ``once``, sends each once). It returns requests/s, p50 and p99 latency by
kind, and every error: a 5xx answer, an answer other than the kind expects,
or a transport error (a connection dropped mid-request).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Request", "load", "summary"]


@dataclass(frozen=True)
class Request:
    """One kind of request.

    Attributes:
        kind: its name in the results.
        method: ``GET``, ``POST``...
        path: the path; ``{client}`` and ``{n}`` are the client's number and its request count.
        json: the body (the same placeholders, in its string values).
        ok: the statuses that count as answered.
    """

    kind: str
    method: str
    path: str
    json: dict[str, Any] | None = None
    ok: tuple[int, ...] = (200,)
    headers: dict[str, str] = field(default_factory=dict)


def _fill(value: Any, client: int, n: int) -> Any:
    if isinstance(value, str):
        return value.replace("{client}", str(client)).replace("{n}", str(n))
    if isinstance(value, dict):
        return {k: _fill(v, client, n) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, client, n) for v in value]
    return value


def _process(
    url: str,
    requests: list[Request],
    first: int,
    count: int,
    seconds: float,
    once: bool,
    out: Any,
    gate: Any,
) -> None:
    import httpx

    results: dict[str, list[float]] = {r.kind: [] for r in requests}
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(count + 1)
    go = threading.Event()
    stop_at = [0.0]

    def client(number: int) -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=60) as c:
            ready.wait()
            go.wait()  # stop_at is set: a client never sees it 0 and stops before its first request
            while once or time.monotonic() < stop_at[0]:
                req = requests[n % len(requests)]
                if once and n >= len(requests):
                    break
                t0 = time.perf_counter()
                try:
                    r = c.request(req.method, _fill(req.path, number, n), json=_fill(req.json, number, n),
                                  headers=req.headers)  # fmt: skip
                    took = time.perf_counter() - t0
                    if r.status_code not in req.ok:
                        with lock:
                            errors.append(f"{req.kind}: {r.status_code} {r.text[:200]}")
                except httpx.TransportError as exc:
                    took = time.perf_counter() - t0
                    with lock:
                        errors.append(f"{req.kind}: {type(exc).__name__}: {exc}")
                with lock:
                    results[req.kind].append(took)
                n += 1

    threads = [threading.Thread(target=client, args=(first + i,)) for i in range(count)]
    for t in threads:
        t.start()
    ready.wait()
    gate.wait()  # every process's clients ready: they all begin at once
    began = time.monotonic()
    stop_at[0] = began + seconds
    go.set()
    for t in threads:
        t.join()
    out.put({"results": results, "errors": errors, "elapsed": time.monotonic() - began})


def load(
    url: str,
    requests: list[Request],
    clients: int = 50,
    seconds: float = 10.0,
    processes: int = 4,
    once: bool = False,
) -> dict[str, Any]:
    """Run the clients (see the module docstring); their results."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    per = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    per = [count for count in per if count]
    gate = ctx.Barrier(len(per))
    procs, first = [], 0
    for count in per:
        procs.append(
            ctx.Process(target=_process, args=(url, requests, first, count, seconds, once, out, gate))
        )
        first += count
    for p in procs:
        p.start()
    parts = [out.get(timeout=seconds + 600) for _ in procs]
    for p in procs:
        p.join(30)
    merged: dict[str, list[float]] = {r.kind: [] for r in requests}
    errors: list[str] = []
    for part in parts:
        for kind, values in part["results"].items():
            merged[kind] += values
        errors += part["errors"]
    elapsed = max(part["elapsed"] for part in parts)
    return summary(merged, errors, elapsed)


def summary(latencies: dict[str, list[float]], errors: list[str], elapsed: float) -> dict[str, Any]:
    """Requests/s, p50 and p99 (ms) by kind, and the errors."""
    total = sum(len(v) for v in latencies.values())
    out: dict[str, Any] = {
        "requests": total,
        "requests_per_s": total / elapsed if elapsed else 0.0,
        "errors": len(errors),
        "error_samples": errors[:5],
    }
    for kind, taken in latencies.items():
        values = sorted(taken)
        if values:
            out[kind] = {
                "n": len(values),
                "per_s": len(values) / elapsed if elapsed else 0.0,
                "p50_ms": 1000 * values[len(values) // 2],
                "p99_ms": 1000 * values[min(len(values) - 1, int(len(values) * 0.99))],
            }
    return out
