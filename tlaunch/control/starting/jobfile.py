"""A job written once as a file for its entry point: :class:`JobFile` (``job.json``, 0600, in its run folder).

The submitter writes what runs (the :class:`~tlaunch.jobs.JobSpec`, its own
JSON) and where (the :class:`~.place.Place` its runner gets, the runtime
environment to build first); the entry point (:mod:`.jobmain`) reads it and
deletes it, so the job's environment (its secrets) does not stay on disk nor
ever appears on a command line. The job's result is written beside it
(:mod:`tlaunch.runtime.results`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from tlaunch.control.starting.place import Place
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.pyenv import RuntimeEnv
from tlaunch.runtime.records import write_private

__all__ = ["ENTRY_POINT", "JOB_FILE", "JobFile", "entry_argv"]

JOB_FILE = "job.json"
ENTRY_POINT = "tlaunch.control.starting.jobmain"
"""The module that runs a job file (``python -m``); named here, not imported: it runs as ``__main__``."""


def entry_argv(job_file: str, python: str | None = None) -> list[str]:
    """The command that runs the job of ``job_file`` (``python``: the interpreter, default this one)."""
    return [python or sys.executable, "-m", ENTRY_POINT, job_file]


@dataclass(frozen=True)
class JobFile:
    """A job and where it runs, as its entry point reads them.

    Attributes:
        job: what runs.
        place: where (its ``python`` is filled in once the runtime environment is built).
        runtime_env: requirements built on each host before the job runs there.
        in_env: this machine's environment is built and the entry point runs in it.
    """

    job: JobSpec
    place: Place
    runtime_env: RuntimeEnv | None = None
    in_env: bool = False

    def to_json(self) -> str:
        """The file's text."""
        place = asdict(self.place)
        place.pop("python")  # each host's interpreter is learned as its environment is built
        runtime_env = asdict(self.runtime_env) if self.runtime_env is not None else None
        data = {"job": json.loads(self.job.to_json()), "place": place, "runtime_env": runtime_env}
        return json.dumps({**data, "in_env": self.in_env})

    @classmethod
    def from_json(cls, text: str) -> JobFile:
        """A job file from its text.

        Raises:
            LaunchError: not a job file, or a job with a bad value.
        """
        try:
            data: dict[str, Any] = json.loads(text)
            place = Place(**{**data["place"], "hosts": tuple(data["place"]["hosts"])})
            given = data.get("runtime_env")
            env = RuntimeEnv(**{**given, "pip": tuple(given.get("pip") or ())}) if given else None
        except (ValueError, KeyError, TypeError) as exc:
            raise LaunchError(f"not a job file ({exc}): {text[:200]!r}") from None
        return cls(JobSpec.from_json(json.dumps(data["job"])), place, env, bool(data.get("in_env")))

    def write(self, path: str) -> str:
        """Write the file at ``path`` (0600); its path."""
        write_private(path, self.to_json().encode())
        return path

    @classmethod
    def take(cls, path: str) -> JobFile:
        """Read the file at ``path`` and delete it.

        Raises:
            OSError: it cannot be read.
            LaunchError: it is not a job file.
        """
        with open(path, encoding="utf-8") as f:
            text = f.read()
        os.unlink(path)
        return cls.from_json(text)

    def in_environment(self) -> JobFile:
        """This job file, for the entry point run again in its built environment."""
        return replace(self, in_env=True)
