"""SWOP profiles (``docs/SWOP-profile-schema.yaml`` of the reference): what one SWOP runs.

A profile names the SWOP's group and taskrunner and lists its nodes (``slnodedef``): each node's
identity files, private data, environment variables and GPU options. Keys and nesting are the
reference's; unknown keys are rejected. Relative ``src`` paths of ``BIND`` mounts are resolved
against the profile file's directory.

Fields kept for compatibility but ignored, since nodes are local processes, not containers:
``resourcemgr`` (Docker access), ``network`` (Docker network), ``apls`` (licence server), ``dns``,
``sllabels`` / ``usrlabels``, ``slnetworkopts`` / ``usrnetworkopts``, ``slhostip``, and the AMD
options of ``usrcontaineropts``. Placeholders such as ``<SWARM-NETWORK>`` are accepted there; in a
field the SWOP uses (``privatedata.src``, identity ``src``, ``apisrv`` host, ``gpus``) they are
errors naming the placeholder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from taskdefs.errors import TaskDefError
from taskdefs.fields import (
    MountType,
    OptionalEnvList,
    StrictModel,
    reject_placeholder,
)
from taskdefs.gpus import GpuRequest, parse_gpu_request
from taskdefs.located import load_located, read_text
from taskdefs.validation import describe, located_error, raise_issues, validate_located

__all__ = [
    "Apls",
    "ApiServer",
    "ContainerOptions",
    "IdentityAttribute",
    "IdentityEntry",
    "Locator",
    "NodeEntry",
    "PrivateData",
    "ResourceManager",
    "SlNodeDef",
    "SwopProfile",
    "load_swop_profile",
    "parse_swop_profile",
]

_WHAT = (
    "a SWOP profile: a mapping with keys groupname, taskrunner, policyuri, resourcemgr, network, "
    "apls, apisrv, envvars, nodes"
)

Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]
Port = Annotated[int, Field(ge=0, le=65535)]
HostName = Annotated[str, StringConstraints(min_length=1, max_length=253)]


def _base_dir(info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    return Path(base) if isinstance(base, (str, os.PathLike)) else Path.cwd()


def _resolve_src(value: str, info: ValidationInfo) -> str:
    """Reject placeholders; make a relative BIND source absolute (relative to the profile)."""
    reject_placeholder(value)
    if info.data.get("m_type") != "BIND":
        return value
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = _base_dir(info) / path
    return os.path.normpath(path)


Source = Annotated[str, StringConstraints(min_length=2, max_length=240), AfterValidator(_resolve_src)]
Target = Annotated[str, StringConstraints(min_length=2, max_length=240)]


class ResourceAccess(StrictModel):
    """``resourcemgr.accessinfo`` (ignored: there is no Docker client)."""

    accesstype: Literal["FROMENV"]


class ResourceManager(StrictModel):
    """``resourcemgr`` (ignored: nodes are local processes)."""

    mgrtype: Literal["DOCKER"]
    accessinfo: ResourceAccess


class AplsLocator(StrictModel):
    """``apls.locator`` (ignored: there is no licence server)."""

    host: str
    port: Port | None = None


class Apls(StrictModel):
    """``apls`` (ignored)."""

    locator: AplsLocator


class Locator(StrictModel):
    """``apisrv.locator``: the SN to use; null parts fall back to the SWOP's command line."""

    host: Annotated[HostName, AfterValidator(reject_placeholder)] | None = None
    port: Port | None = None
    service: HostName | None = None


class ApiServer(StrictModel):
    """``apisrv``."""

    locator: Locator


class IdentityAttribute(StrictModel):
    """One identity file: key, certificate, CA certificate or path, or SPIFFE socket.

    ``src`` is the host file or directory (absolute for ``BIND``; a volume name for ``VOLUME``);
    ``tgt`` and ``subPath`` describe the container mount and are kept for reference only.
    """

    a_type: Literal["KEY", "CERT", "CACERT", "CAPATH", "SPIFFE_SOCKETPATH"] = Field(alias="aType")
    m_type: MountType = Field(alias="mType")
    src: Source
    tgt: Target
    sub_path: Target | None = Field(
        default=None, validation_alias=AliasChoices("subPath", "subpath"), alias="subPath"
    )


class IdentityEntry(StrictModel):
    """An item of ``identity``: ``- attribute: {...}``."""

    attribute: IdentityAttribute


class PrivateData(StrictModel):
    """``privatedata``: the node's own data, seen at the RUN_SWARM task's ``PrivateContent``."""

    m_type: MountType = Field(alias="mType")
    src: Source


def _labels(value: object) -> object:
    """Labels as a mapping (``{a: 1}``) or a list of names (``[a, b]``) -> ``{name: text}``."""
    if isinstance(value, dict):
        return {key: "" if item is None else str(item) for key, item in value.items()}
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return dict.fromkeys(value, "")
    msg = f"must be null, a mapping of labels, or a list of label names, got {describe(value)}"
    raise located_error(msg)


Labels = Annotated[dict[str, str], BeforeValidator(_labels)]
NetworkOpts = list[dict[str, object]]


def _single_key_maps(value: object) -> object:
    """``[- gpus: all, - ipc: host]`` -> ``{gpus: all, ipc: host}`` (a mapping is taken as is)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, list):
        msg = f"must be null or a list of 'name: value' items, got {describe(value)}"
        raise located_error(msg)
    merged: dict[str, object] = {}
    for index, item in enumerate(value):
        if not isinstance(item, dict) or len(item) != 1:
            msg = f"must be a single 'name: value' pair, got {describe(item)}"
            raise located_error(msg, (index,))
        ((key, option),) = item.items()
        if key in merged:
            raise located_error(f"option '{key}' is given twice", (index, key))
        merged[key] = option
    return merged


def _nproc(value: object) -> object:
    """``nproc``: a number of processes (1-64) or ``gpus`` (one per GPU the node gets)."""
    if isinstance(value, str) and value.strip().lower() == "gpus":
        return "gpus"
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64:
        return value
    msg = f"must be a number of processes (1-64) or 'gpus' (one per GPU of the node), got {describe(value)}"
    raise located_error(msg)


class ContainerOptions(StrictModel):
    """``usrcontaineropts``: ``gpus``, and ours, ``nproc``; the AMD/Docker options are kept, ignored.

    ``nproc`` (ours) runs the ML program as that many local processes under torchrun (one per GPU
    with ``nproc: gpus``); rank 0 syncs with the swarm and broadcasts to the others.
    """

    gpus: Annotated[GpuRequest, BeforeValidator(parse_gpu_request)] | None = None
    nproc: Annotated[int | Literal["gpus"], BeforeValidator(_nproc)] | None = None
    device: list[str] | None = None
    ipc: str | None = None
    shm_size: str | None = Field(default=None, alias="shm-size")
    group_add: list[str] | None = Field(default=None, alias="group-add")
    cap_add: list[str] | None = Field(default=None, alias="cap-add")
    security_opt: list[str] | None = Field(default=None, alias="security-opt")
    privileged: bool | None = None


class SlNodeDef(StrictModel):
    """One SL+ML pair the SWOP runs (``nodes[].slnodedef``)."""

    idx: Annotated[int, Field(ge=0)]
    identity: list[IdentityEntry]
    slhostname: Target | None
    slhostip: Target | None = None
    slport: Port | None = None
    slfsservice: HostName | None = None
    sllabels: Labels | None = None
    slnetworkopts: NetworkOpts | None = None
    privatedata: PrivateData | None
    slenvvars: OptionalEnvList | None
    usrhostname: Target | None
    usrenvvars: OptionalEnvList | None
    usrlabels: Labels | None = None
    usrnetworkopts: NetworkOpts | None = None
    usrcontaineropts: Annotated[ContainerOptions, BeforeValidator(_single_key_maps)] | None = None

    def identity_src(self, a_type: str) -> str | None:
        """``src`` of the first identity attribute of type ``a_type`` (``KEY``, ``CERT`` ...)."""
        for entry in self.identity:
            if entry.attribute.a_type == a_type:
                return entry.attribute.src
        return None

    @property
    def gpus(self) -> GpuRequest | None:
        """The node's GPU request, if any."""
        return self.usrcontaineropts.gpus if self.usrcontaineropts else None

    @property
    def nproc(self) -> int | Literal["gpus"] | None:
        """How many local processes the node's ML program runs as (None: one, without torchrun)."""
        return self.usrcontaineropts.nproc if self.usrcontaineropts else None


class NodeEntry(StrictModel):
    """An item of ``nodes``: ``- slnodedef: {...}``."""

    slnodedef: SlNodeDef


class SwopProfile(StrictModel):
    """A valid SWOP profile.

    ``envvars`` (global, for every SL) are overridden by each node's ``slenvvars``; a task's
    ``Envvars`` by the node's ``usrenvvars``. A ``None`` value means "unset this variable".
    """

    groupname: Name
    taskrunner: Name
    policyuri: str | None
    resourcemgr: ResourceManager
    network: str
    apls: Apls
    apisrv: ApiServer
    envvars: OptionalEnvList | None
    dns: list[str] | None = None
    nodes: Annotated[list[NodeEntry], Field(min_length=1)]

    @field_validator("nodes")
    @classmethod
    def _unique_idx(cls, nodes: list[NodeEntry]) -> list[NodeEntry]:
        seen: dict[int, int] = {}
        hostnames: dict[str, int] = {}
        for index, entry in enumerate(nodes):
            idx = entry.slnodedef.idx
            if idx in seen:
                msg = f"idx {idx} is used twice (also by nodes[{seen[idx]}]); each node needs its own"
                raise located_error(msg, (index, "slnodedef", "idx"))
            seen[idx] = index
            name = entry.slnodedef.slhostname
            if name is not None and name in hostnames:
                msg = (
                    f"slhostname {name!r} is used twice (also by nodes[{hostnames[name]}]); it is the "
                    "node's uid in the swarm, so each node needs its own"
                )
                raise located_error(msg, (index, "slnodedef", "slhostname"))
            if name is not None:
                hostnames[name] = index
        return nodes

    @property
    def node_defs(self) -> list[SlNodeDef]:
        """The nodes' definitions, in file order."""
        return [entry.slnodedef for entry in self.nodes]


def load_swop_profile(path: str | os.PathLike[str]) -> SwopProfile:
    """Read and validate a SWOP profile; relative ``src`` paths resolve against its directory.

    Raises:
        TaskDefError: the file cannot be read, is not YAML, or does not match the schema.
    """
    base_dir = Path(path).absolute().parent
    return parse_swop_profile(read_text(path), source=os.fspath(path), base_dir=base_dir)


def parse_swop_profile(
    text: str, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None
) -> SwopProfile:
    """Validate the text of a SWOP profile (see :func:`load_swop_profile`).

    Args:
        text: the YAML text.
        source: name used in issues.
        base_dir: directory that relative ``src`` paths refer to (default: the current one).
    """
    located = load_located(text, source)
    context = {"base_dir": Path(base_dir) if base_dir is not None else Path.cwd()}
    profile, issues = validate_located(SwopProfile, located, what=_WHAT, context=context)
    raise_issues(issues)
    if profile is None:  # pragma: no cover - issues were raised above
        raise TaskDefError.single(source, "invalid SWOP profile")
    return profile
