"""Backends: one module per way of starting nodes, behind :class:`Backend`."""
