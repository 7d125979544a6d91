"""Launchpad's consumer/producer example, as the README shows it.

python examples/consumer_producer/run.py                            # a process per node
python examples/consumer_producer/run.py --lp_launch_type=local_mt  # threads
python examples/consumer_producer/run.py --lp_terminal=tmux_session # a tmux window per node
"""

from absl import app

from tlaunch import lp_ssh as lp


class Producer:
    def work(self, x):
        return x * x


class Consumer:
    def __init__(self, producers):
        self._producers = producers  # handles arrive as RPC clients

    def run(self):
        futures = [p.futures.work(i) for i, p in enumerate(self._producers)]
        print([f.result() for f in futures])
        lp.stop()  # stops every node


def make_program():
    program = lp.Program("consumer_producers")
    with program.group("producer"):
        producers = [program.add_node(lp.CourierNode(Producer)) for _ in range(4)]
    program.add_node(lp.CourierNode(Consumer, producers), label="consumer")
    return program


def main(_):
    lp.launch(make_program())  # local_mp, current_terminal


if __name__ == "__main__":
    app.run(main)
