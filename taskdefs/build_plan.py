"""What a ``MAKE_USER_CONTAINER`` task means on a host without a container engine.

The ``INLINE`` build steps are Dockerfile lines. :func:`container_build_plan` keeps what a Python
environment on the host can do (the requirements of every ``pip install``) and lists everything
else as skipped, each with its reason, so the SWOP can show exactly what it did not do.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from taskdefs.bodies import MakeUserContainerBody
from taskdefs.errors import TaskDefError

__all__ = [
    "IMAGE_PACKAGES",
    "REASON_HOST_PIP",
    "REASON_SWARM_CLIENT",
    "BuildPlan",
    "container_build_plan",
    "dockerfile_instructions",
    "image_name",
]

REASON_HOST_PIP = "pip of the host environment"
REASON_SWARM_CLIENT = "provided by open-swarm-learning"

# Well-known base images -> the Python packages they carry (installed when missing, matched to torch).
IMAGE_PACKAGES: dict[str, tuple[str, ...]] = {
    "pytorch/pytorch": ("torch", "torchvision", "torchaudio"),
    "nvcr.io/nvidia/pytorch": ("torch", "torchvision", "torchaudio"),
    "rocm/pytorch": ("torch", "torchvision", "torchaudio"),
    "tensorflow/tensorflow": ("tensorflow",),
    "nvcr.io/nvidia/tensorflow": ("tensorflow",),
    "python": (),
    "ubuntu": (),
    "debian": (),
    "nvidia/cuda": (),
}
_INSTRUCTION_REASONS = {
    "COPY": "no image file system; SharedContent and privatedata provide files",
    "ADD": "no image file system; SharedContent and privatedata provide files",
    "ENV": "no image environment; set variables in the task's Envvars or the profile's usrenvvars",
    "WORKDIR": "no image; the RUN_SWARM task's WorkingDir is used",
}
_METADATA = frozenset(
    {"ARG", "LABEL", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "VOLUME", "SHELL", "HEALTHCHECK"}
    | {"STOPSIGNAL", "ONBUILD", "MAINTAINER"}
)
_REASON_METADATA = "image setting; not applicable without a container"
_REASON_SHELL = "shell command of the image build; not run on the host"
_REASON_SYSTEM = "system package manager; install such packages on the host if the program needs them"
_REASON_CONDA = "conda is not used; list the packages as pip requirements instead"
_REASON_PIP_OTHER = "pip command other than install; not needed on the host"

_SEPARATORS = frozenset({"&&", "||", ";", ";;", "|", "&", "(", ")"})
_SYSTEM_TOOLS = frozenset({"apt-get", "apt", "yum", "dnf", "apk", "zypper", "microdnf"})
_CONDA_TOOLS = frozenset({"conda", "mamba", "micromamba"})
_PREFIX_WORDS = frozenset({"sudo", "env", "command", "exec", "time", "nohup"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PIP = re.compile(r"^pip(3(\.\d+)?)?$")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")

# pip options kept (they are valid requirement-file lines that change what gets installed).
_KEEP_WITH_VALUE = {
    "-r": "-r",
    "--requirement": "-r",
    "-c": "-c",
    "--constraint": "-c",
    "-e": "-e",
    "--editable": "-e",
    "-i": "--index-url",
    "--index-url": "--index-url",
    "--extra-index-url": "--extra-index-url",
    "-f": "--find-links",
    "--find-links": "--find-links",
    "--trusted-host": "--trusted-host",
}
_KEEP_FLAGS = frozenset({"--pre"})
# pip options dropped together with their value (the rest are dropped alone).
_DROP_WITH_VALUE = frozenset(
    {"-t", "--target", "--prefix", "--root", "--src", "--upgrade-strategy", "--progress-bar"}
    | {"--log", "--proxy", "--retries", "--timeout", "--exists-action", "--cert", "--client-cert"}
    | {"--cache-dir", "--platform", "--python-version", "--implementation", "--abi", "--report"}
    | {"--global-option", "--install-option", "-C", "--config-settings", "--no-binary"}
    | {"--only-binary", "--python", "--use-feature", "--use-deprecated", "--root-user-action"}
    | {"--keyring-provider", "--hash"}
)


@dataclass
class BuildPlan:
    """The host-side meaning of a container build.

    Attributes:
        requirements: lines for ``pip install -r`` (requirement specifiers, and ``-r file``,
            ``--index-url URL`` ... as written), in order, without duplicates.
        skipped: ``(what, reason)`` for every instruction, command or requirement not carried out.
    """

    requirements: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    image: str | None = None
    image_packages: tuple[str, ...] = ()


def dockerfile_instructions(steps: Iterable[str]) -> list[str]:
    """Join ``BuildSteps`` into Dockerfile instructions.

    Lines ending in ``\\`` continue on the next step; blank lines and ``#`` comments are dropped
    (also inside a continuation, as Docker does).
    """
    out: list[str] = []
    pending = ""
    for step in steps:
        line = step.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        out.append((pending + line).strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def container_build_plan(body: MakeUserContainerBody) -> BuildPlan:
    """Turn ``INLINE`` build steps into pip requirements plus skipped steps with reasons.

    Raises:
        TaskDefError: ``BuildType: REMOTE`` (not implemented by the reference either).
    """
    if body.build_type != "INLINE":
        message = "REMOTE builds are not supported (nor by the reference); write INLINE BuildSteps"
        raise TaskDefError.single("<task body>", message, path="Body.BuildType")
    plan = BuildPlan()
    for instruction in dockerfile_instructions(body.build_steps):
        _add_instruction(plan, instruction)
    return plan


def _add_instruction(plan: BuildPlan, instruction: str) -> None:
    keyword, _, rest = instruction.partition(" ")
    keyword = keyword.upper()
    if keyword == "RUN":
        _add_run(plan, rest.strip())
    elif keyword == "FROM":
        _add_image(plan, rest.strip())
    elif _mentions_swarm_client(instruction):
        plan.skipped.append((instruction, REASON_SWARM_CLIENT))
    elif keyword in _INSTRUCTION_REASONS:
        plan.skipped.append((instruction, _INSTRUCTION_REASONS[keyword]))
    elif keyword in _METADATA:
        plan.skipped.append((instruction, _REASON_METADATA))
    else:
        plan.skipped.append((instruction, "not a Dockerfile instruction"))


def image_name(reference: str) -> str:
    """``nvcr.io/nvidia/pytorch:24.01-py3`` -> ``nvcr.io/nvidia/pytorch`` (tag, digest, stage dropped)."""
    words = [w for w in reference.split() if not w.startswith("--")]
    name = (words[0] if words else "").split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: len(name) - len(last[-1])] + last[-1].split(":", 1)[0]
    return name.removeprefix("docker.io/").removeprefix("library/").lower()


def _add_image(plan: BuildPlan, reference: str) -> None:
    name = image_name(reference)
    plan.image = name
    packages = IMAGE_PACKAGES.get(name)
    if packages is None:
        known = ", ".join(sorted(IMAGE_PACKAGES))
        why = (
            f"unknown base image {name!r}: what it carries is not known here, so nothing is installed for "
            f"it; add RUN pip install lines for the packages it provides (known images: {known})"
        )
        plan.skipped.append((f"FROM {reference}", why))
        return
    plan.image_packages = packages


def _add_run(plan: BuildPlan, script: str) -> None:
    while script.startswith("--"):  # RUN --mount=... --network=...
        _, _, script = script.partition(" ")
        script = script.strip()
    try:
        commands = _exec_form(script) or _shell_commands(script)
    except ValueError as exc:
        plan.skipped.append((f"RUN {script}", f"cannot parse the shell command: {exc}"))
        return
    for argv in commands:
        _add_command(plan, argv)


def _exec_form(script: str) -> list[list[str]] | None:
    if not script.startswith("["):
        return None
    try:
        argv = json.loads(script)
    except json.JSONDecodeError:
        return None
    if isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv):
        return [argv]
    return None


def _shell_commands(script: str) -> list[list[str]]:
    """Split a shell script into commands at ``&&``, ``||``, ``;``, ``|``; drop redirections."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
        elif token in _SEPARATORS:
            commands.append([])
        elif set(token) <= set("<>&"):
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()
            skip_next = True
        else:
            commands[-1].append(token)
    return [argv for argv in commands if argv]


def _add_command(plan: BuildPlan, argv: list[str]) -> None:
    words = _strip_prefix(argv)
    text = shlex.join(argv)
    if not words:
        plan.skipped.append((text, _REASON_SHELL))
        return
    program = words[0].rsplit("/", 1)[-1]
    pip_args = _pip_args(program, words)
    if pip_args is None:
        plan.skipped.append((text, _command_reason(program)))
    elif not pip_args or pip_args[0] != "install":
        plan.skipped.append((text, _REASON_PIP_OTHER))
    else:
        _add_pip_install(plan, pip_args[1:])


def _strip_prefix(argv: list[str]) -> list[str]:
    words = list(argv)
    prefixed = False
    while words and (
        words[0] in _PREFIX_WORDS or _ASSIGNMENT.match(words[0]) or (prefixed and words[0].startswith("-"))
    ):
        prefixed = prefixed or words[0] in _PREFIX_WORDS
        words.pop(0)
    return words


def _pip_args(program: str, words: list[str]) -> list[str] | None:
    """The arguments after ``pip`` (with pip's global options removed), or None if not pip."""
    if _PIP.match(program):
        rest = words[1:]
    elif _PYTHON.match(program) and words[1:3] == ["-m", "pip"]:
        rest = words[3:]
    else:
        return None
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in _DROP_WITH_VALUE and rest:
            rest.pop(0)
    return rest


def _command_reason(program: str) -> str:
    if program in _SYSTEM_TOOLS:
        return _REASON_SYSTEM
    if program in _CONDA_TOOLS:
        return _REASON_CONDA
    return _REASON_SHELL


def _add_pip_install(plan: BuildPlan, args: list[str]) -> None:
    pending = list(args)
    while pending:
        arg = pending.pop(0)
        option, has_value, value = arg.partition("=")
        if arg.startswith("-") and option in _KEEP_WITH_VALUE:
            if not has_value and pending:
                value = pending.pop(0)
            if value:
                _add_requirement(plan, f"{_KEEP_WITH_VALUE[option]} {value}")
        elif arg in _KEEP_FLAGS:
            _add_requirement(plan, arg)
        elif arg.startswith("-"):
            if option in _DROP_WITH_VALUE and not has_value and pending:
                pending.pop(0)
        else:
            _add_specifier(plan, arg)


def _add_specifier(plan: BuildPlan, spec: str) -> None:
    name = _project_name(spec)
    if _mentions_swarm_client(spec) or name == "swarmlearning":
        plan.skipped.append((spec, REASON_SWARM_CLIENT))
    elif name == "pip":
        plan.skipped.append((spec, REASON_HOST_PIP))
    else:
        _add_requirement(plan, spec)


def _add_requirement(plan: BuildPlan, line: str) -> None:
    if line not in plan.requirements:
        plan.requirements.append(line)


def _project_name(spec: str) -> str:
    match = _NAME.match(spec)
    if match is None:
        return ""
    return canonicalize_name(match.group(1))


def _mentions_swarm_client(text: str) -> bool:
    lowered = text.lower()
    return "swarmlearning-client" in lowered or "swarmlearning_client" in lowered
