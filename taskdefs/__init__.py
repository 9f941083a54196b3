"""Task definitions and SWOP profiles of the reference system, validated with located errors.

``load_task_definition`` / ``load_swop_profile`` read the reference's YAML files; every problem is
reported as ``file:line:column: path: message`` in one :class:`TaskDefError`. The ledger keeps a
task body as YAML lines (:func:`body_lines`) and checks them with :func:`validate_task_body`.
:func:`container_build_plan` says what a Docker build means on a host without Docker.

It may import ``wire`` (bounded file reads) and nothing else of the project: the ledger, the SWOP and
swci all use it.
"""

from taskdefs.bodies import (
    BODY_MODELS,
    TASK_TYPES,
    MakeSwarmUserContentBody,
    MakeUserContainerBody,
    MakeUserEnvBody,
    PullAuth,
    PullImageBody,
    RunSwarmBody,
    RunTrialsBody,
    SharedMount,
    TaskBody,
    UserContentOp,
    UserContentOption,
)
from taskdefs.build_plan import (
    REASON_HOST_PIP,
    REASON_SWARM_CLIENT,
    BuildPlan,
    container_build_plan,
    dockerfile_instructions,
)
from taskdefs.catalog import shipped_names, shipped_path
from taskdefs.errors import Issue, TaskDefError
from taskdefs.fields import find_placeholder
from taskdefs.gpus import GpuRequest, parse_gpu_request
from taskdefs.profile import (
    ApiServer,
    Apls,
    ContainerOptions,
    IdentityAttribute,
    IdentityEntry,
    Locator,
    NodeEntry,
    PrivateData,
    ResourceManager,
    SlNodeDef,
    SwopProfile,
    load_swop_profile,
    parse_swop_profile,
)
from taskdefs.task import (
    TaskDefinition,
    TaskType,
    body_lines,
    load_task_definition,
    parse_task_body,
    parse_task_definition,
    validate_task_body,
)
from taskdefs.trials import MAX_TRIALS, ParamRange, SearchSpace, TrialParams, expand_search

__all__ = [
    "BODY_MODELS",
    "REASON_HOST_PIP",
    "REASON_SWARM_CLIENT",
    "TASK_TYPES",
    "ApiServer",
    "Apls",
    "BuildPlan",
    "ContainerOptions",
    "GpuRequest",
    "IdentityAttribute",
    "IdentityEntry",
    "Issue",
    "Locator",
    "MakeSwarmUserContentBody",
    "MakeUserContainerBody",
    "MakeUserEnvBody",
    "NodeEntry",
    "PrivateData",
    "PullAuth",
    "PullImageBody",
    "ResourceManager",
    "RunSwarmBody",
    "RunTrialsBody",
    "SearchSpace",
    "ParamRange",
    "TrialParams",
    "MAX_TRIALS",
    "expand_search",
    "SharedMount",
    "SlNodeDef",
    "SwopProfile",
    "TaskBody",
    "TaskDefError",
    "TaskDefinition",
    "TaskType",
    "UserContentOp",
    "UserContentOption",
    "body_lines",
    "container_build_plan",
    "dockerfile_instructions",
    "find_placeholder",
    "load_swop_profile",
    "load_task_definition",
    "parse_gpu_request",
    "parse_swop_profile",
    "parse_task_body",
    "parse_task_definition",
    "shipped_names",
    "shipped_path",
    "validate_task_body",
]
