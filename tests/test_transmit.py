"""TransmitServer tables, checkpoints and TransmitNode on this machine."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tlaunch import lp_ssh as lp
from tlaunch.rpc.transmit import (
    CheckpointError,
    Table,
    TransmitServer,
    TransmitStopped,
    load_checkpoint,
    save_checkpoint,
)


def test_queue_delivers_every_item_exactly_once_under_contention() -> None:
    server = TransmitServer([Table("q", "queue", max_size=64)])
    got: list[tuple[int, int]] = []
    lock = threading.Lock()

    def produce(w: int) -> None:
        for i in range(500):
            server.insert("q", (w, i))

    def consume() -> None:
        while True:
            try:
                items = server.get_many("q", 10, timeout=1.0)
            except TimeoutError:
                return
            with lock:
                got.extend(items)

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(8)]
    threads += [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 8 * 500 and len(set(got)) == 8 * 500
    for w in range(8):  # FIFO per producer
        assert [i for ww, i in got if ww == w] == list(range(500))


def test_full_queue_waits_then_times_out() -> None:
    server = TransmitServer([Table("q", "queue", max_size=2)])
    server.insert("q", 1)
    server.insert("q", 2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="room in 'q'"):
        server.insert("q", 3, timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 2
    assert server.get("q") == 1 and server.insert("q", 3) == 2


def test_latest_board_waits_for_the_first_item_and_keeps_the_newest() -> None:
    server = TransmitServer()
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(server.get("info")))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive()
    server.insert("info", {"v": 1})
    reader.join(5)
    assert result == [{"v": 1}]
    server.insert("info", {"v": 2})
    assert server.get("info") == {"v": 2} and server.get("info") == {"v": 2} and server.size("info") == 1


def test_replay_evicts_the_oldest_and_samples_without_consuming() -> None:
    server = TransmitServer({"replay": Table("replay", "replay", max_size=5)})
    for i in range(12):
        server.insert("replay", i)
    assert server.size("replay") == 5
    sample = server.sample("replay", 200)
    assert len(sample) == 200 and set(sample) == {7, 8, 9, 10, 11}
    assert server.size("replay") == 5
    with pytest.raises(ValueError, match="use sample"):
        server.get("replay")


def test_stop_wakes_every_waiting_call() -> None:
    stop = threading.Event()
    server = TransmitServer({"q": "queue"}, stop_event=stop)
    errors: list[BaseException] = []

    def wait(fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)

    waiters = [
        threading.Thread(target=wait, args=(lambda: server.get("q"),)),
        threading.Thread(target=wait, args=(lambda: server.get("info"),)),
        threading.Thread(target=wait, args=(lambda: server.sample("q", 1),)),
    ]
    for w in waiters:
        w.start()
    time.sleep(0.2)
    server.close()
    for w in waiters:
        w.join(5)
        assert not w.is_alive()
    assert len(errors) == 3 and all(isinstance(e, TransmitStopped) for e in errors)


def test_tables_are_validated() -> None:
    with pytest.raises(lp.ProgramError, match="kind 'stack' is not one of"):
        lp.TransmitNode({"x": "stack"})
    with pytest.raises(lp.ProgramError, match="'info' is reserved"):
        lp.TransmitNode({"info": "queue"})
    with pytest.raises(ValueError, match="max_size 0"):
        Table("x", "queue", max_size=0)
    with pytest.raises(KeyError, match="no table 'nope'"):
        TransmitServer().size("nope")


def test_checkpoint_round_trip_and_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    server = TransmitServer({"q": "queue", "r": Table("r", "replay", 10)}, checkpoint_path=path)
    for i in range(5):
        server.insert("q", i)
        server.insert("r", {"i": i})
    server.insert("info", "hello")
    server.get("q")
    server.close()  # saves
    again = TransmitServer({"q": "queue", "r": Table("r", "replay", 10)}, checkpoint_path=path)
    assert [again.get("q") for _ in range(4)] == [1, 2, 3, 4]
    assert again.size("r") == 5 and again.get("info") == "hello"
    assert again.tables()["q"]["inserted"] == 5
    again.close()


def test_periodic_checkpoint(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    server = TransmitServer({"q": "queue"}, checkpoint_path=path, checkpoint_every=0.1)
    server.insert("q", "x")
    deadline = time.monotonic() + 5
    while not os.path.exists(path):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert load_checkpoint(path)["q"]["items"] == ["x"]
    server.close()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) - 7], "partial"),
        (lambda b: b[:20], "partial"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "corrupt"),
        (lambda b: b"garbage!" + b[8:], "not a tlaunch transmit checkpoint"),
    ],
)
def test_damaged_checkpoint_is_reported_not_loaded(tmp_path: Path, damage: object, message: str) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(str(path), {"q": {"table": Table("q"), "items": [1, 2, 3], "inserted": 3}})
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CheckpointError, match=message) as info:
        TransmitServer({"q": "queue"}, checkpoint_path=str(path))
    assert "move" in str(info.value) and str(path) in str(info.value)


class Sender:
    def __init__(self, server: object, worker: int) -> None:
        self.server, self.worker = server, worker

    def run(self) -> None:
        self.server.insert_many("data", [(self.worker, i) for i in range(100)])  # type: ignore[attr-defined]
        self.server.send_info({"worker": self.worker})  # type: ignore[attr-defined]


class Collector:
    def __init__(self, server: object, out: str) -> None:
        self.server, self.out = server, out

    def run(self) -> None:
        items = [self.server.get("data", timeout=30) for _ in range(300)]  # type: ignore[attr-defined]
        weights = self.server.get_weight(timeout=30)  # type: ignore[attr-defined]
        with open(self.out, "w") as f:
            f.write(
                repr(
                    (sorted(items), float(weights["w"].sum()), self.server.get_info()["worker"] in (0, 1, 2))
                )
            )  # type: ignore[attr-defined]
        lp.stop()


class Publisher:
    def __init__(self, server: object) -> None:
        self.server = server

    def run(self) -> None:
        self.server.insert_weight({"w": np.ones((256, 256), dtype=np.float32)})  # type: ignore[attr-defined]


def test_transmit_node_local(tmp_path: Path) -> None:
    out = tmp_path / "out"
    program = lp.Program("transmit_local")
    server = program.add_node(lp.TransmitNode({"data": "queue"}), label="server")
    with program.group("sender"):
        for w in range(3):
            program.add_node(lp.PyClassNode(Sender, server, w))
    program.add_node(lp.PyClassNode(Publisher, server), label="publisher")
    program.add_node(lp.PyClassNode(Collector, server, str(out)), label="collector")
    lp.launch(program, terminal="output_to_files")
    items, total, info_ok = eval(out.read_text())
    assert items == sorted((w, i) for w in range(3) for i in range(100))
    assert total == 256 * 256 and info_ok
