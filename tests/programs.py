"""Programs shared by tests (importable by node processes)."""

from __future__ import annotations

import os
import time

import numpy as np

from tlaunch import lp_ssh as lp


def write_pid(path: str) -> None:
    """Write this process's pid to ``path`` whole: tests read a pid file as soon as it exists."""
    with open(path + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".part", path)


class Producer:
    def work(self, context: int) -> int:
        return context * 2

    def echo(self, x: object) -> object:
        return x

    def fail(self) -> None:
        raise KeyError("no such item")

    def whoami(self) -> tuple[str | None, int | None, str]:
        ctx = lp.get_context()
        return ctx.label, ctx.index, ctx.run_id


class Consumer:
    def __init__(self, producers: list[object], out: str) -> None:
        self._producers = producers
        self._out = out

    def run(self) -> None:
        futures = [p.futures.work(i) for i, p in enumerate(self._producers)]  # type: ignore[attr-defined]
        results = [f.result() for f in futures]
        with open(self._out, "w") as f:
            f.write(repr(results))
        lp.stop()


def consumer_producers(out: str, n: int = 3) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(n)]
    program.add_node(lp.CourierNode(Consumer, producers=producers, out=out), label="consumer")
    return program


class Looper:
    """Runs until the program stops, recording its pid."""

    def __init__(self, pid_dir: str) -> None:
        self._pid_dir = pid_dir

    def run(self) -> None:
        ctx = lp.get_context()
        write_pid(os.path.join(self._pid_dir, f"{ctx.label}_{ctx.index}.pid"))
        while not lp.wait_for_stop(0.05):
            pass


class Stubborn:
    """Ignores the stop signal: teardown must kill it."""

    def __init__(self, pid_dir: str) -> None:
        self._pid_dir = pid_dir

    def run(self) -> None:
        write_pid(os.path.join(self._pid_dir, "stubborn.pid"))
        while True:
            time.sleep(0.1)


def big_array(mib: int) -> np.ndarray:
    a = np.arange(mib << 18, dtype=np.float32)  # 4 bytes each
    return a
