"""The tree data-transfer type of the seed, on 4 hosts: ``python examples/trans_types/tree_type.py``.

Without --hosts it makes 4 SSH test hosts on this machine (needs root); see topologies.tree.
"""

from topologies import run_example, tree

if __name__ == "__main__":
    run_example(tree)
