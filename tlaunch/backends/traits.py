"""Defaults of a backend type's optional capabilities: subclass :class:`BackendTraits`.

A backend that only places runs declares nothing more; one that claims its
environment (SLURM inside an allocation), submits whole programs to a scheduler,
finds its runs again from their records, or ships a value several nodes
share once per host (``shares_values``) overrides the matching member of
:class:`~tlaunch.backends.base.BackendType`.
"""

from __future__ import annotations

from typing import ClassVar

from tlaunch.backends.base import Submission
from tlaunch.backends.handle import RunHandle
from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.records import RunRecord

__all__ = ["BackendTraits"]


class BackendTraits:
    """Defaults of the capabilities a backend may lack (:class:`BackendType`); subclass it."""

    name: ClassVar[str]
    can_submit: ClassVar[bool] = False
    shares_values: ClassVar[bool] = False

    @classmethod
    def claims(cls, plan: LaunchPlan) -> bool:
        """Never: launch this backend by its name."""
        return False

    @classmethod
    def submit(cls, submission: Submission) -> RunHandle:
        """Refused: this backend runs programs, it does not submit them."""
        raise LaunchError(
            f"submit=True: launch_type {cls.name!r} does not submit jobs; use a backend that does "
            "(launch_type='slurm')"
        )

    @classmethod
    def attach(cls, run_dir: str, record: RunRecord) -> RunHandle:
        """Refused: this backend's runs live only in their launcher."""
        raise LaunchError(
            f"run {record.run_id} ran with launch_type {cls.name!r}, whose runs live only in "
            "their launcher's process; nothing else can follow or stop it"
        )
