"""A distributed job as ``tlaunchrun`` describes it, checked, its file, and the LPJob it becomes (pure).

The arguments are the seed's (``lpjob_name``, ``namespace``, ``image``,
``image_pull_policy``, ``gpu``, ``gpu_memory``, ``gpu_cores``,
``set_save_path``, ``set_checkpoint_path``, the launch method ``basic``
(``num_trainer``, ``set_share_file``), ``torchrun`` or ``deepspeed``) plus what a
cluster needs said: the vGPU stack, gang scheduling, the claim mounted at
``/TData``, the restart policy. Every bad value is refused here, before
anything reaches a cluster, with the value, what is valid and how to fix it;
what a method takes is its entry's in :data:`tlaunch.runtime.methods.METHODS`.
A job says what runs, not where: that is the target it is submitted to
(:mod:`tlaunch.control.starting`), which writes it once as a file
(:meth:`JobSpec.to_json`) for the job's entry point.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.k8s.children import TDATA
from tlaunch.k8s.crd import GPU_STACKS, GROUP, KIND, PULL_POLICIES, QUANTITY, RESTART_POLICIES, VERSION
from tlaunch.runtime.methods import DEFAULT_METHOD, METHODS, NNODES, REFERENCE, SETTINGS, get_method

__all__ = ["JobSpec"]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NNODES = re.compile(NNODES)


@dataclass(frozen=True)
class JobSpec:
    """One ``tlaunchrun`` job.

    Attributes:
        lpjob_name: the job's name (a DNS label: lower case, digits, ``-``; at most 40).
        script: the trainer's program (``train.py``) and its arguments.
        image: the image of every pod.
        namespace: the job's namespace on Kubernetes (None: the credentials' own,
            :func:`tlaunch.k8s.client.namespace_of`).
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``.
        method: a launch method of :data:`tlaunch.runtime.methods.METHODS` (``basic``,
            ``torchrun``, ``deepspeed``, ``command``, ``program``, ``function``; an LPJob
            takes those that run on Kubernetes).
        num_trainer: trainer pods (one per node). ``0`` (the default): the method's
            own count (its entry's ``trainers``: torchrun's is the MAX of ``nnodes``,
            as the seed gives torchrun no ``num_trainer``; else 1). After
            construction it is always the pod count.
        set_share_file: basic: ``TLAUNCH_SHARE_FILE`` (and ``--share_file``) points at a
            file under ``/TData/models/<job>`` that every trainer sees.
        rank_args: basic: the trainers' script gets ``--rank R --world_size N`` (and
            ``--share_file F``) after its own arguments (and ``--save_path``), as the
            original TLaunch's basic mode gives them; ``False``: none.
        nnodes: torchrun: ``N`` or ``MIN:MAX`` (elastic).
        nproc_per_node: torchrun/deepspeed: workers per pod.
        max_restarts: torchrun: restarts of the worker group.
        gpu: GPUs per pod.
        gpu_memory: MiB of each GPU (vGPU).
        gpu_cores: percent of each GPU's cores (vGPU), 1..100.
        cpu: CPUs each pod requests (a Kubernetes quantity: ``4``, ``500m``).
        memory: memory each pod requests (a Kubernetes quantity: ``16Gi``).
        gpu_stack: ``hami`` (``nvidia.com/gpu``, ``gpumem``, ``gpucores``) or
            ``volcano`` (``volcano.sh/vgpu-number``, ``-memory``, ``-cores``).
        gang: gang scheduling through Volcano (no pod starts until all can).
        set_save_path: add ``--save_path <models>/<job>`` to the trainers' arguments, after their
            own (a folder tlaunch makes where they run; ``<models>``: ``/TData/models`` in pods,
            ``./tlaunch-models`` of the folder the job is started from elsewhere: :meth:`paths`).
        set_checkpoint_path: add ``--checkpoint_path <models>/<job>/last.tar.gz``.
        tdata_claim: the persistent volume claim mounted at ``/TData`` (a TPod's:
            labelled ``tlaunch.io/tpod``; ``tlaunchrun`` run in a TPod finds it).
        working_dir: the pods' working directory (``tlaunchrun`` in a TPod: the
            current folder's place in the claim, ``/TData/code/mnist``).
        restart_policy: ``Never`` or ``OnFailure`` (the operator restarts failed pods).
        backoff_limit: restarts the operator allows with ``OnFailure``.
        env: extra environment variables of every pod.
    """

    lpjob_name: str
    script: Sequence[str]
    image: str
    namespace: str | None = None
    image_pull_policy: str = "IfNotPresent"
    method: str = DEFAULT_METHOD
    pservers: int = 0
    num_trainer: int = 0
    set_share_file: bool = False
    rank_args: bool = True
    nnodes: str | None = None
    nproc_per_node: int = 1
    max_restarts: int = 0
    gpu: int = 0
    gpu_memory: int | None = None
    gpu_cores: int | None = None
    cpu: str | None = None
    memory: str | None = None
    gpu_stack: str = "hami"
    gang: bool = False
    set_save_path: bool = False
    set_checkpoint_path: bool = False
    tdata_claim: str | None = None
    working_dir: str | None = None
    restart_policy: str = "Never"
    backoff_limit: int = 0
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.script, list):  # one job, one value: its file gives it back as it was
            object.__setattr__(self, "script", tuple(self.script))
        if self.num_trainer == 0 and not isinstance(self.num_trainer, bool) and self.method in METHODS:
            object.__setattr__(self, "num_trainer", METHODS[self.method].trainers(self))  # its own count
        self.check()

    def to_json(self) -> str:
        """The job as JSON (a job's file: :meth:`from_json` reads it back, checked)."""
        return json.dumps({**dataclasses.asdict(self), "script": list(self.script)})

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """A job from :meth:`to_json`'s text.

        Raises:
            LaunchError: not a job, or a bad value (as the constructor says it).
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise LaunchError(f"not a job: {text[:200]!r}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise LaunchError(
                f"a job has no {unknown}; its fields: {[f.name for f in dataclasses.fields(cls)]}"
            )
        return cls(**{**data, "script": tuple(data.get("script") or ())})

    def settings(self) -> dict[str, object]:
        """The job's value of every setting that only some methods take (``SETTINGS``)."""
        return {name: getattr(self, name) for name in SETTINGS}

    def check(self) -> None:
        """Raise :class:`LaunchError` naming the first bad value, what is valid and how to fix it."""
        if (
            not isinstance(self.lpjob_name, str)
            or not _NAME.match(self.lpjob_name)
            or len(self.lpjob_name) > 40
        ):
            raise LaunchError(
                f"lpjob_name={self.lpjob_name!r} is not a valid job name: use lower-case letters, "
                "digits and '-', starting and ending with a letter or digit, at most 40 characters "
                "(e.g. 'ppo-run-1')"
            )
        if self.namespace is not None and not _NAME.match(self.namespace):
            raise LaunchError(
                f"namespace={self.namespace!r} is not a Kubernetes namespace name (e.g. 'team-rl')"
            )
        _one_of("image_pull_policy", self.image_pull_policy, PULL_POLICIES)
        _one_of("method", self.method, list(METHODS))
        if isinstance(self.pservers, bool) or not isinstance(self.pservers, int) or self.pservers < 0:
            raise LaunchError(f"pservers={self.pservers!r} must be a whole number >= 0")
        get_method(self.method).check_settings(self.settings())
        wants = [n for n in ("set_save_path", "set_checkpoint_path") if getattr(self, n)]
        if wants and METHODS[self.method].entry is REFERENCE:
            takers = [name for name, m in METHODS.items() if m.entry is not REFERENCE]
            raise LaunchError(
                f"{wants[0]} adds an argument to a script's own: method {self.method!r} runs FILE:FUNCTION, "
                f"which takes none; drop it, or use one of {takers}"
            )
        _one_of("gpu_stack", self.gpu_stack, GPU_STACKS)
        _one_of("restart_policy", self.restart_policy, RESTART_POLICIES)
        if not self.image or any(c.isspace() for c in self.image):
            raise LaunchError(
                f"image={self.image!r} is not an image reference (e.g. 'pytorch/pytorch:2.4.0')"
            )
        if isinstance(self.script, str) or not self.script:
            raise LaunchError(f"script={self.script!r} must be the program and its arguments, as a list")
        for field_name, low, high in (
            ("num_trainer", 1, 4096),
            ("nproc_per_node", 1, 1024),
            ("max_restarts", 0, 10_000),
            ("gpu", 0, 64),
            ("backoff_limit", 0, 10_000),
        ):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise LaunchError(f"{field_name}={value!r} must be a whole number from {low} to {high}")
        if self.gpu_memory is not None and (not isinstance(self.gpu_memory, int) or self.gpu_memory < 1):
            raise LaunchError(f"gpu_memory={self.gpu_memory!r} must be the MiB of each GPU, >= 1")
        if self.gpu_cores is not None and (
            not isinstance(self.gpu_cores, int) or not 1 <= self.gpu_cores <= 100
        ):
            raise LaunchError(f"gpu_cores={self.gpu_cores!r} must be a percent of each GPU's cores, 1 to 100")
        for field_name in ("cpu", "memory"):
            value = getattr(self, field_name)
            if value is not None and (not isinstance(value, str) or not re.match(QUANTITY, value)):
                raise LaunchError(
                    f"{field_name}={value!r} is not a Kubernetes quantity (e.g. cpu='4' or '500m', "
                    "memory='16Gi')"
                )
        if (self.gpu_memory or self.gpu_cores) and not self.gpu:
            raise LaunchError("gpu_memory and gpu_cores share GPUs: give gpu= (GPUs per pod) with them")
        if self.gang and self.gpu and self.gpu_stack == "hami":
            raise LaunchError(
                "gang=True with gpu_stack='hami' is refused: HAMi's admission webhook ignores pods scheduled "
                "by Volcano, so their GPU limits would not be enforced; use gpu_stack='volcano' (Volcano's "
                "vGPU), or drop gang scheduling"
            )
        if self.nnodes is not None:
            if not _NNODES.match(self.nnodes):
                raise LaunchError(f"nnodes={self.nnodes!r} must be N or MIN:MAX (e.g. '2' or '2:4')")
            first, _, last = self.nnodes.partition(":")
            if int(last or first) < int(first):
                raise LaunchError(f"nnodes={self.nnodes!r}: MIN is more than MAX")
            if int(last or first) != self.num_trainer:
                raise LaunchError(
                    f"nnodes={self.nnodes!r} makes {last or first} pods (torchrun's pods follow the MAX "
                    f"of nnodes) but num_trainer={self.num_trainer}: drop num_trainer, or make it "
                    f"{last or first}"
                )
        if self.working_dir is not None and (
            not isinstance(self.working_dir, str) or not self.working_dir.startswith("/")
        ):
            raise LaunchError(f"working_dir={self.working_dir!r} must be an absolute path in the pods")

    @property
    def models_dir(self) -> str:
        """``/TData/models/<job>``: the job's folder of its pods' ``--save_path``."""
        return f"{TDATA}/models/{self.lpjob_name}"

    def paths(self, models: str = f"{TDATA}/models") -> tuple[str | None, str | None]:
        """Where ``--save_path`` and ``--checkpoint_path`` point (None: not asked for), under
        ``models``: ``<models>/<job>`` and ``<models>/<job>/last.tar.gz``, the seed's layout."""
        folder = f"{models.rstrip('/')}/{self.lpjob_name}"
        return (folder if self.set_save_path else None,
                f"{folder}/last.tar.gz" if self.set_checkpoint_path else None)  # fmt: skip

    def to_lpjob(self) -> dict[str, Any]:
        """The LPJob resource of this job (no namespace when it names none: the credentials' own).

        Raises:
            LaunchError: its method does not run on Kubernetes, or files under ``/TData`` are
                asked for without a claim to put them in.
        """
        method = get_method(self.method)
        pods = method.in_pods()
        wants = [n for n in ("set_save_path", "set_checkpoint_path", "set_share_file") if getattr(self, n)]
        if wants and not self.tdata_claim:
            raise LaunchError(
                f"{wants} put files under {TDATA}, which needs a persistent volume: pass tdata_claim= "
                "(the claim of the user's TPod, e.g. 'tdata-alice'), or run tlaunchrun inside your TPod, "
                "where it finds its namespace and claim itself"
            )
        role: dict[str, Any] = {
            "name": "trainer",
            "replicas": self.num_trainer,
            "command": pods.role_command(self.script),
        }
        if self.env:
            role["env"] = [{"name": k, "value": str(v)} for k, v in sorted(self.env.items())]
        resources: dict[str, Any] = {}
        if self.gpu:
            resources["gpu"] = self.gpu
        if self.gpu_memory:
            resources["gpuMemory"] = self.gpu_memory
        if self.gpu_cores:
            resources["gpuCores"] = self.gpu_cores
        if self.cpu:
            resources["cpu"] = self.cpu
        if self.memory:
            resources["memory"] = self.memory
        if resources:
            role["resources"] = resources
        spec: dict[str, Any] = {
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            "launcher": self.method,
            "gpuStack": self.gpu_stack,
            "gangScheduling": self.gang,
            "restartPolicy": self.restart_policy,
            "backoffLimit": self.backoff_limit,
            "roles": [role],
        }
        if self.tdata_claim:
            spec["tdataClaim"] = self.tdata_claim
        if self.working_dir:
            spec["workingDir"] = self.working_dir
        save, checkpoint = self.paths()
        if save:
            spec["savePath"] = save
        if checkpoint:
            spec["checkpointPath"] = checkpoint
        if self.set_share_file:
            spec["shareFile"] = f"{self.models_dir}/share_file"
        section = pods.section_of(self.settings(), self.num_trainer)
        if section:
            spec[method.name] = section
        metadata = {"name": self.lpjob_name}
        if self.namespace is not None:
            metadata["namespace"] = self.namespace
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}


def _one_of(name: str, value: object, valid: Sequence[str]) -> None:
    if value not in valid:
        raise LaunchError(
            f"{name}={value!r} is not one of {list(valid)}; use one of them (e.g. {valid[0]!r})"
        )
