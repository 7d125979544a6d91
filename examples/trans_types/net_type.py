"""The net data-transfer type of the seed, on 4 hosts: `python examples/trans_types/net_type.py`.

Without --hosts it makes 4 SSH test hosts on this machine (needs root).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hosts_flag import example_hosts
from topologies import net

from tlaunch import lp_ssh as lp

flags.DEFINE_integer("messages", 500, "Messages per worker.")


def main(_: list[str]) -> None:
    with example_hosts(4) as (hosts, ssh_config):
        lp.launch(
            net(hosts, messages=flags.FLAGS.messages), terminal="ssh_tmux_session", ssh_config=ssh_config
        )


if __name__ == "__main__":
    app.run(main)
