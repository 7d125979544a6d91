"""Jobs as ``tlaunchrun`` describes them (:class:`JobSpec`), and the LPJob each becomes (pure)."""

from tlaunch.jobs.spec import JobSpec

__all__ = ["JobSpec"]
