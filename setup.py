"""Kept for `pip install .` on old tooling; pyproject.toml is the source of truth."""

from setuptools import setup

setup()
