"""Launchpad's consumer/producer example, ported by changing one import.

python examples/consumer_producer/run.py                       # processes, this machine
python examples/consumer_producer/run.py --launch_type=local_mt
python examples/consumer_producer/run.py --terminal=tmux_session
"""

from __future__ import annotations

import logging

from absl import app, flags

from tlaunch import lp_ssh as lp

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_producers", 4, "How many producers to start.")
flags.DEFINE_string("launch_type", "local_mp", "local_mp, local_mt or test_mt.")
flags.DEFINE_string("terminal", "current_terminal", "current_terminal, output_to_files or tmux_session.")


class Producer:
    """Serves work() to the consumer over RPC."""

    def work(self, context: int) -> int:
        return context * context


class Consumer:
    """Calls every producer at once through futures, then stops the program."""

    def __init__(self, producers: list[lp.Handle]) -> None:
        self._producers = producers

    def run(self) -> None:
        futures = [producer.futures.work(i) for i, producer in enumerate(self._producers)]  # type: ignore[attr-defined]
        results = [future.result() for future in futures]
        logging.info("results: %s", results)
        print(f"consumer got {results} from {len(results)} producers", flush=True)
        lp.stop()


def make_program(num_producers: int) -> lp.Program:
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(num_producers)]
    program.add_node(lp.CourierNode(Consumer, producers=producers), label="consumer")
    return program


def main(_: list[str]) -> None:
    lp.launch(make_program(FLAGS.num_producers), launch_type=FLAGS.launch_type, terminal=FLAGS.terminal)


if __name__ == "__main__":
    app.run(main)
