"""Command-line entry points: ``tlaunch``."""
