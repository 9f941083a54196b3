"""Tests of ``taskdefs``: the reference's task definitions and SWOP profiles, and located errors."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskdefs
from taskdefs import (
    REASON_HOST_PIP,
    REASON_SWARM_CLIENT,
    GpuRequest,
    MakeUserContainerBody,
    MakeUserEnvBody,
    RunSwarmBody,
    TaskDefError,
    body_lines,
    container_build_plan,
    load_swop_profile,
    load_task_definition,
    parse_gpu_request,
    parse_swop_profile,
    parse_task_body,
    parse_task_definition,
    shipped_path,
    validate_task_body,
)

# --- fixtures: the reference examples (hpe-interface.md §4), placeholders replaced -------------

WHEEL = "swarmlearning-client-py3-none-manylinux_2_24_x86_64.whl"
BUILD_TASK = f"""\
Name: user_env_tf_build_task
TaskType: MAKE_USER_CONTAINER
Author: HPESwarm
Prereq: ROOTTASK
Outcome: user-env-tf2.7.0-swop
Body:
    BuildContext: sl-cli-lib
    BuildType: INLINE
    BuildSteps:
    - FROM tensorflow/tensorflow:2.7.0
    - ' '
    - RUN pip3 install --upgrade pip && pip3 install \\
    - '   keras matplotlib opencv-python pandas protobuf==3.15.6 '
    - ' '
    - RUN pip3 install pip==23.3.2
    - RUN mkdir -p /tmp/hpe-swarmcli-pkg
    - COPY {WHEEL} /tmp/hpe-swarmcli-pkg/{WHEEL}
    - RUN pip3 install /tmp/hpe-swarmcli-pkg/{WHEEL}
    - RUN pip3 install --upgrade pip
"""

RUN_TASK = """\
Name: swarm_mnist_task
TaskType: RUN_SWARM
Author: HPESwarm
Prereq: user_env_tf_build_task
Outcome: swarm_mnist_task
Body:
    Command: model/mnist_tf.py
    Entrypoint: python3
    WorkingDir: /tmp/test
    Envvars: ["MODEL_DIR": model, "MAX_EPOCHS": 2, "MIN_PEERS": 2]
    PrivateContent: /tmp/test/
    SharedContent:
    -   Src: /home/user/workspace/mnist/model
        Tgt: /tmp/test/model
        MType: BIND
"""

CONTENT_TASK = """\
Name: download-task-mnist-local
TaskType : MAKE_SWARM_USER_CONTENT
Author   : HPE-TEST
Prereq   : ROOTTASK
Outcome  : mnist-msn
Body     :
    ContentType : SWARMCONTENT
    OpsList :
        - Operation : DOWNLOAD
          Target    : "http://172.2.2.2:9292/mnist/model/mnist_tf.py"
          Options   :
            - Out   : "model/mnist_tf.py"
"""

PULL_TASK = """\
Name: pull-task-tf2
TaskType : PULL_IMAGE
Author   : HPE-TEST
Prereq   : ROOTTASK
Outcome  : "hub.docker.hpecorp.net/hub/tensorflow-tensorflow:2.7.0"
Body     :
    Tag        : "2.7.0"
    RepoName   : "tensorflow-tensorflow"
    OrgAndReg  : "hub.docker.hpecorp.net/hub/"
    Auth       : ~
"""

PROFILE = """\
groupname: demo
taskrunner: defaulttaskbb.taskdb.sml.hpe
policyuri: ~
resourcemgr:
    mgrtype: DOCKER
    accessinfo:
      accesstype: FROMENV
network: <SWARM-NETWORK>
apls:
  locator:
    host: <LICENSE-SERVER-ADDRESS>
    port: ~
apisrv:
  locator:
    host: ~
    port: ~
    service: ~
envvars:
  - SL_LOG_LEVEL: INFO
  - http_proxy: ~
  - https_proxy: ~
  - no_proxy: ~
  - HTTP_PROXY: ~
  - HTTPS_PROXY: ~
  - NO_PROXY: ~
nodes:
  - slnodedef:
      idx: 0
      identity:
        - attribute: {aType: KEY, mType: BIND, src: "cert/sl-1-key.pem", tgt: /cert/k.pem, subPath: null}
        - attribute:
            aType: CERT
            mType: BIND
            src: "cert/sl-1-cert.pem"
            tgt: "/swarm-cert/sl-1-cert.pem"
            subPath: null
        - attribute: {aType: CAPATH, mType: BIND, src: "/etc/swarm/capath", tgt: "/cert/ca", subPath: null}
      slhostname: sl1
      slhostip: <HOST_ADDRESS>
      slport: 16000
      usrhostname: user1
      privatedata:
        src: "user1/data-and-scratch"
        mType: BIND
      slenvvars: null
      usrenvvars : [SCRATCH_DIR : "user1"]
      usrcontaineropts:
        - gpus : "all"
"""

ALL_TASKS = [BUILD_TASK, RUN_TASK, CONTENT_TASK, PULL_TASK]


def _issue_lines(text: str, source: str = "t.yaml") -> list[str]:
    with pytest.raises(TaskDefError) as caught:
        parse_task_definition(text, source)
    return str(caught.value).splitlines()


def _profile_issue_lines(text: str) -> list[str]:
    with pytest.raises(TaskDefError) as caught:
        parse_swop_profile(text, "p.yaml", base_dir="/srv/swop")
    return str(caught.value).splitlines()


# --- task definitions: the reference examples ---------------------------------------------------


@pytest.mark.parametrize("text", ALL_TASKS)
def test_reference_tasks_parse(text: str) -> None:
    defn = parse_task_definition(text)
    assert defn.name in text
    assert isinstance(defn.body, taskdefs.BODY_MODELS[defn.task_type])


def test_run_task_fields_and_flow_form_envvars() -> None:
    defn = parse_task_definition(RUN_TASK)
    body = defn.body
    assert isinstance(body, RunSwarmBody)
    assert body.envvars == [("MODEL_DIR", "model"), ("MAX_EPOCHS", "2"), ("MIN_PEERS", "2")]
    assert body.working_dir == "/tmp/test"
    assert body.private_content == "/tmp/test/"
    assert body.shared_content is not None
    assert body.shared_content[0].m_type == "BIND"
    assert defn.prereq == "user_env_tf_build_task"


@pytest.mark.parametrize(
    ("envvars", "expected"),
    [
        ("~", None),
        ("[A: 1, B: ~, C: true, D: 1.5]", [("A", "1"), ("B", ""), ("C", "True"), ("D", "1.5")]),
        ("\n      - X: a\n      - Y: 'b c'", [("X", "a"), ("Y", "b c")]),
        ("{Z: 3, A: 4}", [("Z", "3"), ("A", "4")]),
    ],
)
def test_envvars_forms(envvars: str, expected: list[tuple[str, str]] | None) -> None:
    text = RUN_TASK.replace(
        '["MODEL_DIR": model, "MAX_EPOCHS": 2, "MIN_PEERS": 2]', envvars.replace("\n", "\n  ")
    )
    body = parse_task_definition(text).body
    assert isinstance(body, RunSwarmBody)
    assert body.envvars == expected


def test_make_user_env_body() -> None:
    text = """\
Name: env
TaskType: MAKE_USER_ENV
Author: me
Prereq: ROOTTASK
Outcome: env-1
Body:
    Requirements: [torch>=2.1, numpy, -r requirements.txt]
    PythonVersion: "3.11"
"""
    body = parse_task_definition(text).body
    assert isinstance(body, MakeUserEnvBody)
    assert body.requirements == ["torch>=2.1", "numpy", "-r requirements.txt"]
    assert body.python_version == "3.11"
    assert body.build_context is None


def test_pull_task_with_credentials() -> None:
    text = PULL_TASK.replace("Auth       : ~", "Auth       : {Username: bob, Password: ''}")
    body = parse_task_definition(text).body
    assert isinstance(body, taskdefs.PullImageBody)
    assert isinstance(body.auth, taskdefs.PullAuth)
    assert body.auth.username == "bob"


# --- located errors ------------------------------------------------------------------------------


def test_error_points_at_the_key_and_names_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "taskdefs").mkdir()
    (tmp_path / "taskdefs" / "run_mnist.yaml").write_text(RUN_TASK.replace("MType: BIND", "MType: BINDD"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TaskDefError) as caught:
        load_task_definition("taskdefs/run_mnist.yaml")
    assert str(caught.value) == (
        "taskdefs/run_mnist.yaml:15:9: Body.SharedContent[0].MType: must be BIND or VOLUME, got 'BINDD'"
    )
    (issue,) = caught.value.issues
    assert (issue.source, issue.line, issue.column) == ("taskdefs/run_mnist.yaml", 15, 9)
    assert issue.path == "Body.SharedContent[0].MType"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # missing keys point at the parent mapping
        ("Author: HPESwarm\n", "", "1:1: missing required key 'Author'"),
        ("    Entrypoint: python3\n", "", "6:1: Body: missing required key 'Entrypoint'"),
        (
            "    PrivateContent: /tmp/test/\n",
            "",
            "6:1: Body: missing required key 'PrivateContent' (write 'PrivateContent: ~' when there is none)",
        ),
        ("        Tgt: /tmp/test/model\n", "", "13:9: Body.SharedContent[0]: missing required key 'Tgt'"),
        # unknown keys point at the key and list the valid ones
        (
            "Outcome: swarm_mnist_task\n",
            "Outcome: swarm_mnist_task\nColour: red\n",
            "6:1: Colour: unknown key 'Colour'; valid keys are: Name, TaskType, Author, Prereq, Outcome, "
            "Body",
        ),
        (
            "        MType: BIND\n",
            "        MType: BIND\n        Mode: ro\n",
            "16:9: Body.SharedContent[0].Mode: unknown key 'Mode'; valid keys are: Src, Tgt, MType",
        ),
        # wrong types point at the key
        (
            "Author: HPESwarm",
            "Author: [a, b]",
            "3:1: Author: must be a string, got a list",
        ),
        (
            "Author: HPESwarm",
            "Author: 2024",
            "3:1: Author: must be a string, got integer 2024 (put it in quotes to make it a string)",
        ),
        ("Author: HPESwarm", "Author: ''", "3:1: Author: must not be empty"),
        ("Author: HPESwarm", "Author: " + "a" * 161, "3:1: Author: must be at most 160 characters, got 161"),
        (
            "TaskType: RUN_SWARM",
            "TaskType: BUILD_SWARM",
            "2:1: TaskType: must be one of RUN_SWARM, MAKE_USER_CONTAINER, MAKE_USER_ENV, "
            "MAKE_SWARM_USER_CONTENT, PULL_IMAGE or RUN_TRIALS, got 'BUILD_SWARM'",
        ),
        (
            "    SharedContent:\n    -   Src: /home/user/workspace/mnist/model\n"
            "        Tgt: /tmp/test/model\n        MType: BIND\n",
            "    SharedContent: /data\n",
            "12:5: Body.SharedContent: must be a list, got '/data'",
        ),
        ("WorkingDir: /tmp/test", "WorkingDir: tmp/test", "9:5: Body.WorkingDir: must be an absolute path"),
        # placeholders
        (
            "Src: /home/user/workspace/mnist/model",
            "Src: <PROJECT-MODEL>",
            "13:9: Body.SharedContent[0].Src: placeholder <PROJECT-MODEL> was not replaced",
        ),
        (
            "WorkingDir: /tmp/test",
            "WorkingDir: <CURRENT-PATH>/test",
            "9:5: Body.WorkingDir: placeholder <CURRENT-PATH> was not replaced",
        ),
        # envvars items
        (
            '"MAX_EPOCHS": 2,',
            '"MAX EPOCHS": 2,',
            "10:35: Body.Envvars[1].MAX EPOCHS: 'MAX EPOCHS' is not a valid environment variable name",
        ),
        (
            '"MAX_EPOCHS": 2,',
            '"MAX_EPOCHS": [2],',
            "10:35: Body.Envvars[1].MAX_EPOCHS: value must be a string, number, boolean or null, got a list",
        ),
        ('"MAX_EPOCHS": 2,', "5,", "10:35: Body.Envvars[1]: must be a single NAME: value pair"),
        ("Envvars: [", "Envvars: 7 #[", "10:5: Body.Envvars: must be null or a list of NAME: value pairs"),
        # YAML syntax errors, with PyYAML's line and column
        (
            "Prereq: user_env_tf_build_task",
            "Prereq: [user_env",
            "5:8: YAML syntax error: while parsing a flow sequence at line 4: expected ','",
        ),
        (
            "    Entrypoint: python3",
            "\tEntrypoint: python3",
            "8:1: YAML syntax error: while scanning for the next token: found character '\\t'",
        ),
        (
            "Prereq: user_env_tf_build_task",
            "Name: again",
            "4:1: Name: duplicate key 'Name' (first at line 1)",
        ),
    ],
)
def test_error_forms(old: str, new: str, expected: str) -> None:
    assert old in RUN_TASK
    lines = _issue_lines(RUN_TASK.replace(old, new, 1))
    assert any(line.startswith(f"t.yaml:{expected}") for line in lines), lines


def test_all_issues_are_collected_in_order() -> None:
    text = (
        RUN_TASK.replace("Author: HPESwarm", "Author: 5")
        .replace("WorkingDir: /tmp/test", "WorkingDir: rel")
        .replace("MType: BIND", "MType: NFS")
    )
    lines = _issue_lines(text)
    assert [line.split(": ")[1] for line in lines] == [
        "Author",
        "Body.WorkingDir",
        "Body.SharedContent[0].MType",
    ]


def test_unknown_task_type_skips_the_body() -> None:
    lines = _issue_lines(BUILD_TASK.replace("MAKE_USER_CONTAINER", "MAKE_IT"))
    assert len(lines) == 1
    assert lines[0].startswith("t.yaml:2:1: TaskType: must be one of")


def test_body_of_the_wrong_kind() -> None:
    lines = _issue_lines(CONTENT_TASK.replace("MAKE_SWARM_USER_CONTENT", "RUN_SWARM"))
    assert "t.yaml:6:1: Body: missing required key 'Command'" in lines
    assert any(line.startswith("t.yaml:7:5: Body.ContentType: unknown key 'ContentType'") for line in lines)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "t.yaml:1:1: empty; expected a task definition"),
        ("# only a comment\n", "t.yaml:1:1: empty; expected a task definition"),
        ("- Name: x\n", "t.yaml:1:1: expected a task definition: a mapping with keys Name"),
        (
            "a: 1\n---\nb: 2\n",
            "t.yaml:2:1: YAML syntax error: expected a single document in the stream at line 1: "
            "found another",
        ),
        ("Name: &a [*a]\n", "t.yaml:1:7: Name[0]: recursive YAML alias"),
        ("Name: !!python/object:os.system x\n", "t.yaml:1:7: Name: cannot read this value"),
        ("<<: {Name: x}\n", "t.yaml:1:1: YAML merge keys ('<<') are not supported"),
        ("Name: x\x00\n", "t.yaml:1:8: YAML syntax error: character '\\x00' is not allowed"),
    ],
)
def test_document_level_errors(text: str, expected: str) -> None:
    lines = _issue_lines(text)
    assert lines[0].startswith(expected), lines


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"Name: x\nAuthor: \xff\xfe\n")
    with pytest.raises(TaskDefError, match=r"bad\.yaml:2:9: not UTF-8 text \(byte 0xff\)"):
        load_task_definition(bad)
    with pytest.raises(TaskDefError, match="cannot read the file"):
        load_task_definition(tmp_path / "missing.yaml")


# --- body lines (the ledger) ---------------------------------------------------------------------


@pytest.mark.parametrize("text", ALL_TASKS)
def test_body_lines_round_trip(text: str) -> None:
    defn = parse_task_definition(text)
    lines = body_lines(defn)
    assert all("\n" not in line for line in lines)
    assert validate_task_body(defn.task_type, lines) == defn.body
    assert parse_task_body(defn.task_type, lines) == defn.body
    assert body_lines(defn) == lines


def test_body_lines_of_run_task() -> None:
    lines = body_lines(parse_task_definition(RUN_TASK))
    assert lines[:4] == [
        "Command: model/mnist_tf.py",
        "Entrypoint: python3",
        "WorkingDir: /tmp/test",
        "Envvars:",
    ]
    assert "- MAX_EPOCHS: '2'" in lines


def test_validate_task_body_locates_issues_by_line() -> None:
    lines = ["Command: run.py", "Entrypoint: python3", "WorkingDir: relative", "Envvars: ~"]
    with pytest.raises(TaskDefError) as caught:
        validate_task_body("RUN_SWARM", lines)
    text = str(caught.value)
    assert "<task body>:1:1: Body: missing required key 'PrivateContent'" in text
    assert "<task body>:3:1: Body.WorkingDir: must be an absolute path" in text
    with pytest.raises(TaskDefError) as again:
        validate_task_body("RUN_SWARM", lines)
    assert str(again.value) == text


@pytest.mark.parametrize(
    ("task_type", "lines", "expected"),
    [
        ("ROOT", ["a: 1"], "<task body>: TaskType: must be one of RUN_SWARM"),
        ("RUN_SWARM", [], "<task body>:1:1: Body: empty; expected the Body of a RUN_SWARM task"),
        ("PULL_IMAGE", ["Tag: [x"], "<task body>:1:8: YAML syntax error"),
        ("MAKE_USER_ENV", ["Requirements: []"], "<task body>:1:1: Body.Requirements: must have at least 1"),
    ],
)
def test_validate_task_body_errors(task_type: str, lines: list[str], expected: str) -> None:
    with pytest.raises(TaskDefError) as caught:
        validate_task_body(task_type, lines)
    assert str(caught.value).startswith(expected)


# --- build plan ----------------------------------------------------------------------------------


def test_build_plan_of_the_reference_example() -> None:
    body = parse_task_definition(BUILD_TASK).body
    assert isinstance(body, MakeUserContainerBody)
    plan = container_build_plan(body)
    assert plan.requirements == ["keras", "matplotlib", "opencv-python", "pandas", "protobuf==3.15.6"]
    wheel = "/tmp/hpe-swarmcli-pkg/swarmlearning-client-py3-none-manylinux_2_24_x86_64.whl"
    skipped = dict(plan.skipped)
    assert skipped["pip"] == REASON_HOST_PIP
    assert skipped["pip==23.3.2"] == REASON_HOST_PIP
    assert skipped[wheel] == REASON_SWARM_CLIENT
    assert plan.image == "tensorflow/tensorflow"
    assert plan.image_packages == ("tensorflow",)
    assert "FROM tensorflow/tensorflow:2.7.0" not in skipped
    assert skipped["mkdir -p /tmp/hpe-swarmcli-pkg"].startswith("shell command")
    copy = next(what for what, _ in plan.skipped if what.startswith("COPY"))
    assert skipped[copy] == REASON_SWARM_CLIENT
    assert all(reason for _, reason in plan.skipped)


@pytest.mark.parametrize(
    ("line", "image", "packages"),
    [
        ("FROM pytorch/pytorch:1.13.0-cuda11.6-cudnn8-runtime", "pytorch/pytorch", ("torch", "torchvision")),
        ("FROM nvcr.io/nvidia/pytorch:24.01-py3 AS base", "nvcr.io/nvidia/pytorch", ("torch", "torchvision")),
        ("FROM docker.io/library/python:3.11-slim", "python", ()),
        (
            "FROM --platform=linux/amd64 tensorflow/tensorflow:2.7.0-gpu",
            "tensorflow/tensorflow",
            ("tensorflow",),
        ),
    ],
)
def test_a_well_known_base_image_brings_its_python_packages(
    line: str, image: str, packages: tuple[str, ...]
) -> None:
    plan = _plan(line)
    assert plan.image == image
    assert set(packages) <= set(plan.image_packages)
    assert not [what for what, _ in plan.skipped if what.startswith("FROM")]


def test_an_unknown_base_image_is_reported_not_dropped() -> None:
    plan = _plan("FROM example.org/lab/custom-ml:7", "RUN pip install scipy")
    assert plan.image_packages == ()
    why = dict(plan.skipped)["FROM example.org/lab/custom-ml:7"]
    assert "unknown base image 'example.org/lab/custom-ml'" in why
    assert "RUN pip install" in why
    assert plan.requirements == ["scipy"]


def _plan(*steps: str) -> taskdefs.BuildPlan:
    body = MakeUserContainerBody.model_validate(
        {"BuildContext": None, "BuildType": "INLINE", "BuildSteps": list(steps)}
    )
    return container_build_plan(body)


@pytest.mark.parametrize(
    ("steps", "requirements"),
    [
        (
            ["RUN python3 -m pip install -q --no-cache-dir 'numpy<2' torch==2.3.1"],
            ["numpy<2", "torch==2.3.1"],
        ),
        (
            ["RUN pip install -r requirements.txt -c constraints.txt"],
            ["-r requirements.txt", "-c constraints.txt"],
        ),
        (["RUN pip install --requirement=req.txt"], ["-r req.txt"]),
        (
            ["RUN pip install torch --index-url https://download.pytorch.org/whl/cu121"],
            ["torch", "--index-url https://download.pytorch.org/whl/cu121"],
        ),
        (["RUN pip install --target /opt/x --progress-bar off scipy"], ["scipy"]),
        (['RUN ["pip3", "install", "pandas"]'], ["pandas"]),
        (["RUN apt-get update; pip install a > /dev/null 2>&1 || true"], ["a"]),
        (["RUN pip install a && \\", "    pip install b \\", "# comment", "    c"], ["a", "b", "c"]),
        (["RUN --mount=type=cache,target=/root/.cache pip install a a"], ["a"]),
        (["RUN sudo -H PIP_NO_CACHE_DIR=1 pip3.11 --no-cache-dir install a"], ["a"]),
        (["RUN pip uninstall -y foo", "RUN conda install numpy"], []),
        (["RUN pip install 'unclosed"], []),
    ],
)
def test_build_plan_pip_forms(steps: list[str], requirements: list[str]) -> None:
    assert _plan(*steps).requirements == requirements


def test_build_plan_reasons() -> None:
    plan = _plan(
        "FROM python:3.11",
        "ENV A=1",
        "WORKDIR /app",
        "EXPOSE 80",
        "RUN apt-get install -y git",
        "RUN conda install numpy",
        "RUN pip install --upgrade pip setuptools",
        "FOO bar",
    )
    reasons = dict(plan.skipped)
    assert reasons["ENV A=1"].startswith("no image environment")
    assert reasons["WORKDIR /app"].startswith("no image")
    assert reasons["EXPOSE 80"].startswith("image setting")
    assert reasons["apt-get install -y git"].startswith("system package manager")
    assert reasons["conda install numpy"].startswith("conda is not used")
    assert reasons["pip"] == REASON_HOST_PIP
    assert reasons["FOO bar"] == "not a Dockerfile instruction"
    assert plan.requirements == ["setuptools"]


def test_build_plan_remote_is_refused() -> None:
    body = MakeUserContainerBody.model_validate(
        {"BuildContext": None, "BuildType": "REMOTE", "BuildSteps": ["https://x/Dockerfile"]}
    )
    with pytest.raises(TaskDefError, match="REMOTE builds are not supported"):
        container_build_plan(body)


# --- shipped task definitions --------------------------------------------------------------------


def test_shipped_env_task() -> None:
    defn = load_task_definition(shipped_path("user_env_pyt_build"))
    assert defn.task_type == "MAKE_USER_ENV"
    assert isinstance(defn.body, MakeUserEnvBody)
    assert defn.body.requirements == ["torch", "numpy", "torchmetrics"]


def test_shipped_container_task() -> None:
    defn = load_task_definition(shipped_path("user_env_pyt_container.yaml"))
    assert isinstance(defn.body, MakeUserContainerBody)
    plan = container_build_plan(defn.body)
    assert plan.requirements == ["torch", "numpy", "torchmetrics"]
    assert ("pip==24.0", REASON_HOST_PIP) in plan.skipped


def test_shipped_path_unknown() -> None:
    with pytest.raises(FileNotFoundError, match=r"user_env_pyt_build\.yaml"):
        shipped_path("nope")
    assert taskdefs.shipped_names() == ["user_env_pyt_build.yaml", "user_env_pyt_container.yaml"]


# --- SWOP profiles -------------------------------------------------------------------------------


def test_reference_profile_parses(tmp_path: Path) -> None:
    path = tmp_path / "swop1_profile.yaml"
    path.write_text(PROFILE)
    profile = load_swop_profile(path)
    (node,) = profile.node_defs
    assert profile.groupname == "demo"
    assert profile.network == "<SWARM-NETWORK>"
    assert profile.envvars is not None
    assert profile.envvars[:2] == [("SL_LOG_LEVEL", "INFO"), ("http_proxy", None)]
    assert node.identity_src("KEY") == str(tmp_path / "cert/sl-1-key.pem")
    assert node.identity_src("CAPATH") == "/etc/swarm/capath"
    assert node.identity_src("CACERT") is None
    assert node.privatedata is not None
    assert node.privatedata.src == str(tmp_path / "user1/data-and-scratch")
    assert node.usrenvvars == [("SCRATCH_DIR", "user1")]
    assert node.slenvvars is None
    assert node.slport == 16000
    assert node.gpus == GpuRequest(kind="all")


def test_profile_variants() -> None:
    text = (
        PROFILE.replace("subPath: null}", "subpath: null}")
        .replace("slenvvars: null", "slenvvars: [SL_RAM_INTENSIVE : False]")
        .replace("mType: BIND\n      slenvvars", "mType: VOLUME\n      slenvvars")
        .replace("service: ~", "service: ~\ndns: [<Bind9-IP>]")
        + "      sllabels: [a, b]\n      usrnetworkopts:\n        - ip: <ML-IP-1>\n"
    )
    profile = parse_swop_profile(text, base_dir="/srv/swop")
    (node,) = profile.node_defs
    assert node.slenvvars == [("SL_RAM_INTENSIVE", "False")]
    assert node.privatedata is not None
    assert node.privatedata.src == "user1/data-and-scratch"
    assert node.sllabels == {"a": "", "b": ""}
    assert profile.dns == ["<Bind9-IP>"]


def _two_nodes(second_idx: int) -> str:
    node = PROFILE[PROFILE.index("  - slnodedef:") :]
    second = node.replace("idx: 0", f"idx: {second_idx}").replace("user1", "user2")
    return PROFILE + second.replace("slhostname: sl1", "slhostname: sl2")


def test_profile_with_two_nodes() -> None:
    profile = parse_swop_profile(_two_nodes(1), base_dir="/srv/swop")
    assert [node.idx for node in profile.node_defs] == [0, 1]


def test_a_duplicate_slhostname_is_refused_naming_both_nodes() -> None:
    text = _two_nodes(1).replace("slhostname: sl2", "slhostname: sl1")
    with pytest.raises(
        TaskDefError, match=r"nodes\[1\].slnodedef.slhostname: slhostname 'sl1' is used twice"
    ):
        parse_swop_profile(text, base_dir="/srv/swop")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'src: "user1/data-and-scratch"',
            'src: "<PROJECT>"',
            "p.yaml:43:9: nodes[0].slnodedef.privatedata.src: placeholder <PROJECT> was not replaced",
        ),
        (
            'src: "cert/sl-1-key.pem"',
            'src: "<PROJECT-CERTS>/sl-1-key.pem"',
            "p.yaml:30:48: nodes[0].slnodedef.identity[0].attribute.src: placeholder <PROJECT-CERTS>",
        ),
        (
            "host: ~",
            "host: <SN-ADDRESS>",
            "p.yaml:15:5: apisrv.locator.host: placeholder <SN-ADDRESS> was not replaced",
        ),
        (
            "      usrhostname: user1\n",
            "",
            "p.yaml:27:5: nodes[0].slnodedef: missing required key 'usrhostname' (write 'usrhostname: ~'",
        ),
        ("policyuri: ~\n", "", "p.yaml:1:1: missing required key 'policyuri'"),
        (
            "slport: 16000",
            "slports: 16000",
            "p.yaml:40:7: nodes[0].slnodedef.slports: unknown key 'slports'; valid keys are: idx, identity,",
        ),
        (
            "aType: KEY,",
            "aType: PEM,",
            "p.yaml:30:23: nodes[0].slnodedef.identity[0].attribute.aType: must be one of KEY, CERT, CACERT",
        ),
        ("slport: 16000", "slport: '16000'", "p.yaml:40:7: nodes[0].slnodedef.slport: must be an integer"),
        ("idx: 0", "idx: -1", "p.yaml:28:7: nodes[0].slnodedef.idx: must be at least 0, got integer -1"),
        ("slport: 16000", "slport: 70000", "p.yaml:40:7: nodes[0].slnodedef.slport: must be at most 65535"),
        (
            "slport: 16000",
            "slport: 16000\n      slnetworkopts: 10.0.0.1",
            "p.yaml:41:7: nodes[0].slnodedef.slnetworkopts: must be a list, got '10.0.0.1'",
        ),
        (
            '- gpus : "all"',
            '- gpus : "some"',
            "p.yaml:48:11: nodes[0].slnodedef.usrcontaineropts[0].gpus: must be 'all', 'auto', a GPU count",
        ),
        (
            '- gpus : "all"',
            '- gpus : "all"\n        - gpus: 2',
            "p.yaml:49:11: nodes[0].slnodedef.usrcontaineropts[1].gpus: option 'gpus' is given twice",
        ),
        ("mgrtype: DOCKER", "mgrtype: K8S", "p.yaml:5:5: resourcemgr.mgrtype: must be DOCKER, got 'K8S'"),
        (
            'usrenvvars : [SCRATCH_DIR : "user1"]',
            "usrenvvars : [SCRATCH DIR : x]",
            "p.yaml:46:21: nodes[0].slnodedef.usrenvvars[0].SCRATCH DIR: 'SCRATCH DIR' is not a valid",
        ),
        ("nodes:\n", "nodes: []\nx:\n", "p.yaml:26:1: nodes: must have at least 1 item(s), got 0"),
    ],
)
def test_profile_error_forms(old: str, new: str, expected: str) -> None:
    assert old in PROFILE
    lines = _profile_issue_lines(PROFILE.replace(old, new, 1))
    assert any(line.startswith(expected) for line in lines), lines


def test_profile_duplicate_idx() -> None:
    lines = _profile_issue_lines(_two_nodes(0))
    assert lines == [
        "p.yaml:50:7: nodes[1].slnodedef.idx: idx 0 is used twice (also by nodes[0]); each node needs its own"
    ]


# --- GPU requests --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind", "count", "devices", "text"),
    [
        ("all", "all", None, (), "all"),
        ("ALL", "all", None, (), "all"),
        ("auto", "auto", None, (), "auto"),
        ("device=0,1", "devices", None, ("0", "1"), "device=0,1"),
        ("device=3,5", "devices", None, ("3", "5"), "device=3,5"),
        ('"device=2"', "devices", None, ("2",), "device=2"),
        ("device=GPU-8f6a2b1c-0d3e", "devices", None, ("GPU-8f6a2b1c-0d3e",), "device=GPU-8f6a2b1c-0d3e"),
        (2, "count", 2, (), "2"),
        ("4", "count", 4, (), "4"),
        ("count=1", "count", 1, (), "1"),
    ],
)
def test_gpu_forms(value: object, kind: str, count: int | None, devices: tuple[str, ...], text: str) -> None:
    request = parse_gpu_request(value)
    assert (request.kind, request.count, request.devices) == (kind, count, devices)
    assert str(request) == text
    assert parse_gpu_request(str(request)) == request


@pytest.mark.parametrize(
    "value", ["some", 0, -2, True, None, [0], "device=", "device=0,0", "device=<GPU UUID>"]
)
def test_gpu_bad_forms(value: object) -> None:
    with pytest.raises(ValueError, match=r"must be 'all'|twice"):
        parse_gpu_request(value)


def test_gpu_selection() -> None:
    visible = ["0", "1", "2"]
    assert parse_gpu_request("all").select(visible, 5) == visible
    assert parse_gpu_request("auto").select(visible, 4) == ["1"]
    assert parse_gpu_request("auto").select([], 4) == []
    assert parse_gpu_request(2).select(visible, 0) == ["0", "1"]
    assert parse_gpu_request("device=3,5").select(visible, 0) == ["3", "5"]


# --- robustness: any mutation of a valid file gives a TaskDefError, never another exception -------

_GARBAGE = st.text(max_size=12) | st.sampled_from(
    ["\x00", "\t", ":", "- ", "[", "{", "&a", "*a", "!!", "<X>", "'"]
)


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, str]:
    kind, text = draw(st.sampled_from([("task", t) for t in ALL_TASKS] + [("profile", PROFILE)]))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "value", "insert", "duplicate"]))
        if action == "delete" and len(lines) > 1:
            del lines[index]
        elif action == "value":
            head = lines[index].split(":", 1)[0]
            lines[index] = f"{head}: {draw(_GARBAGE)}"
        elif action == "insert":
            column = draw(st.integers(0, len(lines[index])))
            lines[index] = lines[index][:column] + draw(_GARBAGE) + lines[index][column:]
        else:
            lines.insert(index, lines[index])
    return kind, "\n".join(lines) + "\n"


def _issues_of(call: Callable[[], object]) -> list[taskdefs.Issue] | None:
    """Run ``call``; the issues of its ``TaskDefError`` (never empty), or None when it passed."""
    try:
        call()
    except TaskDefError as exc:
        issues = exc.issues
    else:
        return None
    assert issues
    return issues


def _parse(kind: str, text: str) -> None:
    if kind == "task":
        parse_task_definition(text, "m.yaml")
    else:
        parse_swop_profile(text, "m.yaml", base_dir="/srv/swop")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated())
def test_mutations_only_raise_taskdef_error(case: tuple[str, str]) -> None:
    kind, text = case
    issues = _issues_of(lambda: _parse(kind, text))
    assert all(issue.source == "m.yaml" and issue.message for issue in issues or [])


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(ALL_TASKS), st.binary(min_size=1, max_size=8), st.integers(0, 400))
def test_garbage_bytes_only_raise_taskdef_error(text: str, garbage: bytes, offset: int) -> None:
    raw = text.encode()
    raw = raw[:offset] + garbage + raw[offset:]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "g.yaml"
        path.write_bytes(raw)
        _issues_of(lambda: load_task_definition(path))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(ALL_TASKS), st.data())
def test_body_line_mutations_only_raise_taskdef_error(text: str, data: st.DataObject) -> None:
    defn = parse_task_definition(text)
    lines = body_lines(defn)
    index = data.draw(st.integers(0, len(lines) - 1))
    lines[index] = data.draw(st.sampled_from(["", lines[index][:-1], lines[index] + "x", "  - x: ["]))
    _issues_of(lambda: validate_task_body(defn.task_type, lines))
