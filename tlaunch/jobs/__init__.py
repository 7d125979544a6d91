"""Jobs: as ``tlaunchrun`` describes them (:class:`JobSpec`, pure), and the job server's client."""

from tlaunch.jobs.client import Client, JobServerError, submit_self
from tlaunch.jobs.spec import JobSpec

__all__ = ["Client", "JobServerError", "JobSpec", "submit_self"]
