"""The star data-transfer type of the seed, on 4 hosts: ``python examples/trans_types/star_type.py``.

Without --hosts it makes 4 SSH test hosts on this machine (needs root); see topologies.star.
"""

from topologies import run_example, star

if __name__ == "__main__":
    run_example(star)
