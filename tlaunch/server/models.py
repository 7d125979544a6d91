"""The job server's request and error bodies (pydantic models: its OpenAPI document), and their checks.

What a job's launch method takes comes from the method table
(:data:`tlaunch.runtime.methods.METHODS`): the ``launch_method`` names, each
setting's field and help, which of ``entry_point``, ``command`` and ``program``
is the job's entry (:data:`ENTRY_FIELDS`), and the one check of a method's
settings, whose :class:`~tlaunch.errors.LaunchError` is the 400's message.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from tlaunch.errors import LaunchError
from tlaunch.jobs.program import ProgramRef, check_reference
from tlaunch.runtime.methods import (
    COMMAND,
    DEFAULT_METHOD,
    METHODS,
    NNODES,
    REFERENCE,
    SCRIPT,
    SETTINGS,
    Entry,
    describe,
    get_method,
    methods_of,
)
from tlaunch.server.deps import ApiError

__all__ = [
    "CODES",
    "ENTRY_FIELDS",
    "ErrorBody",
    "ErrorDetail",
    "KubernetesTarget",
    "SlurmTarget",
    "SubmitJob",
    "check_submission",
]

_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"
_Word = Annotated[str, StringConstraints(max_length=4096)]
"""An argument, a path, a host: bounded, as every string of a request is."""
_Key = Annotated[str, StringConstraints(max_length=256)]
_Value = Annotated[str, StringConstraints(max_length=65536)]
_Label = Annotated[str, StringConstraints(max_length=256)]
_PoolWord = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
"""A host label, a GPU model word, a pool's name."""
_STRICT = ConfigDict(extra="forbid")  # an unknown field is a 400 naming it, never dropped

CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
CODES |= {405: "method_not_allowed", 409: "conflict", 413: "too_large", 422: "invalid", 500: "internal"}
"""Each error status and its ``code``."""


class ErrorDetail(BaseModel):
    """What went wrong, for people and programs."""

    status: int
    code: str
    message: str
    problems: list[dict[str, str]] | None = None


class ErrorBody(BaseModel):
    """The one shape of every error answer."""

    error: ErrorDetail


class SlurmTarget(BaseModel):
    """Submit with ``sbatch`` (the package's folder must be on the cluster's shared filesystem)."""

    model_config = _STRICT
    partition: _Key | None = None
    account: _Key | None = None
    qos: _Key | None = None
    time: _Key | None = None
    sbatch_args: list[_Word] = Field(default_factory=list, max_length=64)


class KubernetesTarget(BaseModel):
    """Submit an LPJob (the server's own Kubernetes credentials: ``$KUBECONFIG``, or its pod's).

    The package travels in the job's run Secret (at most about 700 KiB packed) and is
    each pod's working directory; its ``requirements.txt`` is installed before the
    command, on the ``/TData`` volume of ``tdata_claim`` when given (once for every pod).
    """

    model_config = _STRICT
    namespace: str | None = Field(None, pattern=_NAME, description="default: the credentials' own")
    tdata_claim: str | None = Field(
        None, pattern=_NAME, description="a TPod claim mounted at /TData (runtime environments built there)"
    )


def _known_method(name: str) -> str:
    try:
        return get_method(name).name
    except LaunchError as exc:
        raise ValueError(str(exc)) from None


MethodName = Annotated[
    str,
    AfterValidator(_known_method),
    Field(json_schema_extra={"enum": list(METHODS)}, description="the job's launch method"),
]

ENTRY_FIELDS: dict[Entry, str] = {SCRIPT: "entry_point", COMMAND: "command", REFERENCE: "program"}
"""The field that holds a job's entry, by what the entry of its method is."""


class SubmitJob(BaseModel):
    """``POST /v1/trainer/job``: the seed's PaddleJob fields and tlaunch's own.

    Every field is bounded (lists, maps and strings), and an unknown field is refused.
    """

    model_config = _STRICT
    job_name: str = Field(pattern=_NAME, description="unique; a DNS label (lower case, digits, '-')")
    trainer_package: str = Field(pattern=r"^[0-9a-f]{64}$", description="a package_id from POST /v1/package")
    entry_point: _Word = Field("train.py", description="the script in the package that trains")
    args: list[_Word] = Field(default_factory=list, max_length=1024)
    launch_method: MethodName = DEFAULT_METHOD
    command: list[_Word] | None = Field(
        None,
        max_length=1024,
        description="launch_method command: what each trainer runs (any program), before args",
    )
    program: _Word | None = Field(
        None,
        description="launch_method program or function: FILE:FUNCTION of the package (program: it returns "
        "a tlaunch Program, called with pservers=N when pservers is given)",
    )
    num_trainer: int | None = Field(None, ge=1, le=4096, description="trainers (default: the method's own)")
    nproc_per_node: int = Field(1, ge=1, le=1024, description=SETTINGS["nproc_per_node"].help)
    nnodes: str | None = Field(None, pattern=NNODES, description=SETTINGS["nnodes"].help)
    max_restarts: int = Field(0, ge=0, le=10_000, description=SETTINGS["max_restarts"].help)
    set_share_file: bool = Field(False, description=SETTINGS["set_share_file"].help)
    rank_args: bool = Field(True, description=SETTINGS["rank_args"].help)
    hosts: list[_Key] | None = Field(None, max_length=4096, description="SSH hosts (default: this machine)")
    ssh_config: _Word | None = None
    slurm: SlurmTarget | None = None
    kubernetes: KubernetesTarget | None = Field(
        None, description="an LPJob (base_image: its pods' image; cpu_num, gpu_num, memory: each pod's)"
    )
    env: dict[_Key, _Value] = Field(default_factory=dict, max_length=256)
    labels: dict[_Label, _Label] = Field(default_factory=dict, max_length=64)
    input: _Word | None = None
    output: _Word | None = None
    base_image: _Word | None = None
    memory: _Key | None = None
    use_gpu: bool = False
    cpu_num: int | None = Field(None, ge=1)
    gpu_num: int | None = Field(None, ge=0)
    pservers: int = Field(0, ge=0, description=SETTINGS["pservers"].help)
    pip: list[_Word] | None = Field(
        None,
        max_length=1024,
        description="the job's requirements, as lines of a requirements file ('torch==2.4', "
        "'./wheels/x.whl', with --hash=sha256:... for a lock), installed in its runtime environment; "
        "instead of a requirements file of the package",
    )
    requirements: _Word | None = Field(
        None,
        description="a requirements file of the package (default: requirements.txt, when it names "
        "anything), e.g. a lock made by `uv pip compile --generate-hashes` or `pip-compile`",
    )
    gpu_label: _PoolWord | None = Field(
        None, description="the server's pool: a host label or GPU model word every trainer's host has (a100)"
    )
    pool: _PoolWord | None = Field(None, description="the server's pool: one of its named pools")
    priority: int = Field(
        0, ge=-1000, le=1000, description="the server's pool: higher goes first in the queue (an admin's)"
    )
    restart_policy: Literal["Never", "OnFailure"] = Field(
        "Never",
        description="OnFailure: a job that fails (or is lost) runs again, backoff_limit times at most "
        "(Kubernetes' Job fields; max_restarts is torchrun's restarts of its worker group)",
    )
    backoff_limit: int = Field(0, ge=0, le=1000, description="with restart_policy OnFailure: how many times")


def check_submission(body: SubmitJob, package_dir: str) -> None:
    """Refuse what the job cannot be, naming it (nothing of the package runs here).

    Raises:
        ApiError: 400, with what is wrong and how to fix it.
    """
    method = get_method(body.launch_method)
    try:
        method.check_settings({name: getattr(body, name) for name in SETTINGS}, called="launch_method")
    except LaunchError as exc:
        raise ApiError(400, str(exc)) from None
    for entry in (REFERENCE, COMMAND):
        field, given = ENTRY_FIELDS[entry], getattr(body, ENTRY_FIELDS[entry])
        if method.entry is entry and not given:
            raise ApiError(400, f"launch_method {method.name}: give {field}, {entry.what}")
        if method.entry is not entry and given:
            takers = describe(methods_of(entry))
            raise ApiError(400, f"{field} is for launch_method {takers}, not {method.name}")
    if method.entry is REFERENCE:
        try:
            check_reference(package_dir, ProgramRef.parse(body.program or ""), body.pservers)
        except LaunchError as exc:
            raise ApiError(400, str(exc)) from None
    if method.entry is SCRIPT:
        entry_point = os.path.normpath(body.entry_point)
        if entry_point.startswith(("..", "/")) or not os.path.isfile(os.path.join(package_dir, entry_point)):
            raise ApiError(400, f"entry_point {body.entry_point!r} is not a file of the package")
    given = [name for name in ("hosts", "slurm", "kubernetes") if getattr(body, name)]
    if len(given) > 1:
        raise ApiError(400, f"{' and '.join(given)}: give one place for the job (hosts, slurm or kubernetes)")
    if body.kubernetes is not None and not body.base_image:
        raise ApiError(400, "kubernetes: give base_image, the image of the job's pods (it needs python)")
    if body.kubernetes is not None and body.ssh_config:
        raise ApiError(400, "ssh_config is for hosts; a kubernetes job has none")
    _check_requirements(body, package_dir)
    pooled = [name for name in ("gpu_label", "pool") if getattr(body, name)]
    if pooled and given:
        raise ApiError(
            400,
            f"{' and '.join(pooled)} ask the server's pool, but the job names {given[0]}: drop one "
            "(a job with hosts, slurm or kubernetes runs there, without the pool)",
        )
    if body.backoff_limit and body.restart_policy == "Never":
        raise ApiError(
            400, f"backoff_limit={body.backoff_limit} with restart_policy Never: set restart_policy OnFailure"
        )
    bad_env = [k for k in body.env if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)]
    if bad_env:
        raise ApiError(400, f"env names {bad_env} are not valid; use letters, digits and _")


def _check_requirements(body: SubmitJob, package_dir: str) -> None:
    """Refuse requirements the job cannot install: both kinds given, a line that is not one, a file
    the package does not hold.

    Raises:
        ApiError: 400, naming what is wrong.
    """
    if body.pip is not None and body.requirements is not None:
        raise ApiError(400, "give pip or requirements, not both: pip lists the requirements themselves")
    for i, line in enumerate(body.pip or ()):
        if "\n" in line or "\r" in line or not line.strip():
            raise ApiError(400, f"pip[{i}] {line!r}: one requirement per item, not empty, no newline")
    if body.requirements is not None:
        name = os.path.normpath(body.requirements)
        if name.startswith(("..", "/")) or not os.path.isfile(os.path.join(package_dir, name)):
            raise ApiError(
                400, f"requirements {body.requirements!r} is not a file of the package; name one it holds"
            )
