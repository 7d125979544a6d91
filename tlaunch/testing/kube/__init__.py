"""A stand-in Kubernetes API server for tests (see :mod:`tlaunch.testing.kube.server`)."""

from tlaunch.testing.kube.server import StandInAPIServer

__all__ = ["StandInAPIServer"]
