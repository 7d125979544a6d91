"""What a submitted program's launch needs once its job is scheduled: :class:`Submitted`.

``launch(..., submit=True)`` hands the program to its backend's scheduler with
this; the backend ships it as it is, beside the program, to the batch job,
whose command is ``python -m tlaunch.launcher`` (:mod:`tlaunch.launcher.__main__`):
that launch takes these options, and the backend's own for inside the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlaunch.options import LaunchOptions

__all__ = ["Submitted"]


@dataclass(frozen=True)
class Submitted:
    """The launch inside a submitted job, besides its backend's options.

    Attributes:
        launch_type: the backend that runs it there (the one submitted to).
        options: the options of every launch, as given to the submitting one.
        terminal: the terminal asked for (None: the backend's default).
    """

    launch_type: str
    options: LaunchOptions
    terminal: str | None = None
