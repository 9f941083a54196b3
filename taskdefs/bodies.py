"""The ``Body`` of each task type, as in the reference schema (``docs/SWOP-task-schema.yaml``).

Python attributes are snake_case; the YAML keys are the reference's (``WorkingDir``, ``MType``).
``MAKE_USER_ENV`` is ours: a Python virtual environment built from pip requirements, the way a
host without a container engine runs the ML program.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_serializer,
)

from taskdefs.fields import (
    AbsPath,
    EnvList,
    FreeStr,
    MountType,
    PathStr,
    StrictModel,
    reject_placeholder,
)
from taskdefs.trials import SearchSpace
from taskdefs.validation import CUSTOM_ERROR

__all__ = [
    "BODY_MODELS",
    "TASK_TYPES",
    "MakeSwarmUserContentBody",
    "MakeUserContainerBody",
    "MakeUserEnvBody",
    "PullAuth",
    "PullImageBody",
    "RunSwarmBody",
    "RunTrialsBody",
    "SharedMount",
    "TaskBody",
    "UserContentOp",
    "UserContentOption",
]

TrialName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
CommandStr = Annotated[FreeStr, AfterValidator(reject_placeholder)]


class SharedMount(StrictModel):
    """One ``SharedContent`` entry: ``Src`` (host directory or volume) seen at ``Tgt``."""

    src: PathStr = Field(alias="Src")
    tgt: AbsPath = Field(alias="Tgt")
    m_type: MountType = Field(alias="MType")


class RunSwarmBody(StrictModel):
    """``RUN_SWARM``: run ``Entrypoint Command`` in ``WorkingDir`` on every assigned node.

    ``PrivateContent`` is where each node's ``privatedata`` (SWOP profile) appears; ``Envvars``
    are ordered ``(name, value)`` pairs, overridden by the profile's ``usrenvvars``.
    """

    command: CommandStr = Field(alias="Command")
    entrypoint: CommandStr = Field(alias="Entrypoint")
    working_dir: AbsPath = Field(alias="WorkingDir")
    envvars: EnvList | None = Field(alias="Envvars")
    private_content: AbsPath | None = Field(alias="PrivateContent")
    shared_content: Annotated[list[SharedMount], Field(min_length=1, max_length=10)] | None = Field(
        alias="SharedContent"
    )

    @field_serializer("envvars")
    def _dump_envvars(self, value: list[tuple[str, str]] | None) -> list[dict[str, str]] | None:
        if value is None:
            return None
        return [{name: item} for name, item in value]


class RunTrialsBody(RunSwarmBody):
    """``RUN_TRIALS``: run ``Entrypoint Command`` once per trial of ``Search``.

    ``Mode: LOCAL`` (the default) runs each trial as one process on one slot of a SWOP host (a GPU, or
    a CPU slot where there is none). ``Mode: SWARM`` runs each trial as one whole swarm run, one trial
    after the other: every SWOP of the assignment starts its SL nodes (as ``RUN_SWARM`` does) in a
    training contract of the trial's own (``swarmlearning.trial.trial_contract()``), and the trial's
    metrics are the mean over the nodes. A trial reports its metrics with
    ``swarmlearning.trial.report_trial``; ``Metric`` names the one that ranks trials and ``Goal`` says
    whether lower (``MINIMIZE``) or higher is better. A trial whose process dies is run again up to
    ``Retries`` times.
    """

    mode: Literal["LOCAL", "SWARM"] = Field(default="LOCAL", alias="Mode")
    search: SearchSpace = Field(alias="Search")
    metric: TrialName = Field(alias="Metric")
    goal: Literal["MINIMIZE", "MAXIMIZE"] = Field(default="MINIMIZE", alias="Goal")
    retries: Annotated[int, Field(ge=0, le=10)] = Field(default=1, alias="Retries")


BuildStep = Annotated[str, StringConstraints(max_length=160)]
VolumeName = Annotated[
    str, StringConstraints(min_length=3, max_length=160), AfterValidator(reject_placeholder)
]


class MakeUserContainerBody(StrictModel):
    """``MAKE_USER_CONTAINER``: Dockerfile lines (``INLINE``) or a URL (``REMOTE``, unimplemented).

    Without a container engine, :func:`taskdefs.build_plan.container_build_plan` turns the
    ``INLINE`` steps into pip requirements for the host environment.
    """

    build_context: VolumeName | None = Field(alias="BuildContext")
    build_type: Literal["INLINE", "REMOTE"] = Field(alias="BuildType")
    build_steps: Annotated[list[BuildStep], Field(min_length=1, max_length=80)] = Field(alias="BuildSteps")


def _requirement(value: str) -> str:
    if not value.strip():
        msg = "must be a pip requirement such as 'torch>=2.1', not blank"
        raise ValueError(msg)
    if "\n" in value or "\r" in value:
        msg = "must be one pip requirement on one line"
        raise ValueError(msg)
    return value.strip()


def _python_version(value: str) -> str:
    parts = value.split(".")
    if not 2 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        msg = f"must be a Python version such as '3.11', got {value!r}"
        raise ValueError(msg)
    return value


Requirement = Annotated[str, StringConstraints(min_length=1, max_length=160), AfterValidator(_requirement)]


class MakeUserEnvBody(StrictModel):
    """``MAKE_USER_ENV`` (ours): a Python environment with ``Requirements`` installed by pip.

    ``PythonVersion`` is informational (the environment uses the SWOP's interpreter);
    ``BuildContext`` is null or a directory that relative requirement paths refer to.
    """

    requirements: Annotated[list[Requirement], Field(min_length=1, max_length=200)] = Field(
        alias="Requirements"
    )
    python_version: Annotated[str, AfterValidator(_python_version)] | None = Field(
        default=None, alias="PythonVersion"
    )
    build_context: PathStr | None = Field(default=None, alias="BuildContext")


class UserContentOption(StrictModel):
    """One entry of ``Options``; ``Out`` is the only option the reference supports."""

    out: PathStr = Field(alias="Out")


class UserContentOp(StrictModel):
    """One entry of ``OpsList``: download or extract ``Target``."""

    operation: Literal["DOWNLOAD", "EXTRACT"] = Field(alias="Operation")
    target: FreeStr = Field(alias="Target")
    options: list[UserContentOption] = Field(alias="Options")


class MakeSwarmUserContentBody(StrictModel):
    """``MAKE_SWARM_USER_CONTENT``: fill a content volume (one copy, or one per SL node)."""

    content_type: Literal["BUILDCONTENT", "SWARMCONTENT"] = Field(alias="ContentType")
    ops_list: Annotated[list[UserContentOp], Field(min_length=1, max_length=20)] = Field(alias="OpsList")


class PullAuth(StrictModel):
    """Registry credentials of a ``PULL_IMAGE`` task."""

    username: FreeStr = Field(alias="Username")
    password: Annotated[str, StringConstraints(max_length=160)] = Field(alias="Password")


def _auth_kind(value: object) -> str | None:
    if isinstance(value, str):
        return "(config file)"
    if isinstance(value, dict):
        return "(credentials)"
    return None


Auth = Annotated[
    Annotated[FreeStr, Tag("(config file)")] | Annotated[PullAuth, Tag("(credentials)")],
    Discriminator(
        _auth_kind,
        custom_error_type=CUSTOM_ERROR,
        custom_error_message=(
            "must be null, the path of a Docker config.json, or {Username: ..., Password: ...}"
        ),
    ),
]


class PullImageBody(StrictModel):
    """``PULL_IMAGE``: the image ``OrgAndReg`` + ``RepoName`` : ``Tag``."""

    tag: FreeStr = Field(alias="Tag")
    repo_name: FreeStr = Field(alias="RepoName")
    org_and_reg: FreeStr = Field(alias="OrgAndReg")
    auth: Auth | None = Field(alias="Auth")


TaskBody = (
    RunSwarmBody
    | RunTrialsBody
    | MakeUserContainerBody
    | MakeUserEnvBody
    | MakeSwarmUserContentBody
    | PullImageBody
)

BODY_MODELS: dict[str, type[TaskBody]] = {
    "RUN_SWARM": RunSwarmBody,
    "RUN_TRIALS": RunTrialsBody,
    "MAKE_USER_CONTAINER": MakeUserContainerBody,
    "MAKE_USER_ENV": MakeUserEnvBody,
    "MAKE_SWARM_USER_CONTENT": MakeSwarmUserContentBody,
    "PULL_IMAGE": PullImageBody,
}
TASK_TYPES: tuple[str, ...] = tuple(BODY_MODELS)
