"""The net data-transfer type of the seed, on 4 hosts: ``python examples/trans_types/net_type.py``.

Without --hosts it makes 4 SSH test hosts on this machine (needs root); see topologies.net.
"""

from topologies import net, run_example

if __name__ == "__main__":
    run_example(net)
