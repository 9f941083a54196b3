"""The reference's GPU MNIST example, README steps 2-11, as written: copies, gen-cert, sed, run-sn,
run-swop, run-swci, on files in the reference's formats with its names and placeholders (all four SL
nodes share the certificate sl-1). It ends with four nodes printing the reference's final line and
identical saved models in each user's private scratch directory. Then step 10 runs again against the
same ledger (the init script's tasks exist, finalized, with the same bodies) and trains again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from daemons.broker import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FINAL_TEXT = "All peers and Swarm training rounds finished. Final Swarm model was loaded."

SWCI_INIT = """\
# Assumption : SWOP is already running

# SWCI context setup
EXIT ON FAILURE
wait for ip 172.1.1.1
create context test-mnist with ip 172.1.1.1
switch context test-mnist
EXIT ON FAILURE OFF

#Change to the directory where we are mounting the host
cd /platform/swarm/usr

# Create and finalize build task
EXIT ON FAILURE
create task from taskdefs/build_pyt_user_image.yaml
finalize task build_pyt_user_image
get task info build_pyt_user_image
get task body build_pyt_user_image
list tasks
EXIT ON FAILURE OFF

# Assign build task to taskrunner
EXIT ON FAILURE
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
ASSIGN TASK build_pyt_user_image TO defaulttaskbb.taskdb.sml.hpe WITH 1 PEERS
WAIT FOR TASKRUNNER defaulttaskbb.taskdb.sml.hpe
EXIT ON FAILURE OFF

# Create and finalize swarm run task
EXIT ON FAILURE
create task from taskdefs/run_mnist_pyt.yaml
finalize task run_mnist_pyt
get task info run_mnist_pyt
get task body run_mnist_pyt
list tasks
EXIT ON FAILURE OFF

# Assign run task
EXIT ON FAILURE
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
ASSIGN TASK run_mnist_pyt TO defaulttaskbb.taskdb.sml.hpe WITH 4 PEERS
WAIT FOR TASKRUNNER defaulttaskbb.taskdb.sml.hpe
# Grace period for ML container to save the model,
# before the below reset command cleans up the ML and SL Containers.
SLEEP 1
LIST NODES
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
EXIT ON FAILURE OFF

# List and reset training contract
EXIT ON FAILURE
LIST CONTRACTS
RESET CONTRACT defaultbb.cqdb.sml.hpe
EXIT ON FAILURE OFF

# Exit
EXIT
"""

BUILD_TASK = """\
Name: build_pyt_user_image
TaskType: MAKE_USER_CONTAINER
Author: HPESwarm
Prereq: ROOTTASK
Outcome: user-image-nvidia-pyt
Body:
    BuildContext: sl-cli-lib
    BuildType: INLINE
    BuildSteps:
    - FROM pytorch/pytorch:1.13.0-cuda11.6-cudnn8-runtime
    - RUN pip install --upgrade pip
    - RUN pip install torchmetrics
    - RUN mkdir -p /tmp/hpe-swarmcli-pkg
    - COPY swarmlearning-client-py3-none-manylinux_2_24_x86_64.whl  /tmp/hpe-swarmcli-pkg/swarmlearning-client-py3-none-manylinux_2_24_x86_64.whl
    - RUN pip install /tmp/hpe-swarmcli-pkg/swarmlearning-client-py3-none-manylinux_2_24_x86_64.whl
"""

RUN_TASK = """\
Name: run_mnist_pyt
TaskType: RUN_SWARM
Author: HPESwarm
Prereq: build_pyt_user_image
Outcome: run_mnist_pyt
Body:
    Command: model/mnist_pyt.py
    Entrypoint: python3
    WorkingDir: /tmp/test
    Envvars: ["DATA_DIR": app-data, "SCRATCH_DIR": scratch, "MODEL_DIR": model, "MAX_EPOCHS": 1, "MIN_PEERS": 4, "SYNC_FREQUENCY": 4]
    PrivateContent: /tmp/test/
    SharedContent:
    -   Src: <CURRENT-PATH>/workspace/mnist-pyt/model
        Tgt: /tmp/test/model
        MType: BIND
"""

PROFILE_HEAD = """\
---
groupname  : demo
taskrunner : defaulttaskbb.taskdb.sml.hpe
policyuri  : ~
resourcemgr :
    mgrtype    : DOCKER
    accessinfo :
        accesstype : FROMENV
network    : host-1-net
apls :
    locator :
        host : 172.1.1.1
        port : ~
apisrv :
    locator :
        host : 172.1.1.1
        port : ~
envvars :
    - SL_LOG_LEVEL : INFO
    - SL_WAIT_FOR_FULL_QUORUM_SECONDS : 2
    - http_proxy : ~
    - https_proxy : ~
    - no_proxy : ~
nodes :
"""

PROFILE_NODE = """\
    - slnodedef :
        idx : {idx}
        identity :
            - attribute :
                aType : KEY
                mType : BIND
                src : "<CURRENT-PATH>/workspace/mnist-pyt/cert/sl-1-key.pem"
                tgt : "/swarm-cert/sl-{n}-key.pem"
                subPath : null
            - attribute :
                aType : CERT
                mType : BIND
                src : "<CURRENT-PATH>/workspace/mnist-pyt/cert/sl-1-cert.pem"
                tgt : "/swarm-cert/sl-{n}-cert.pem"
                subPath : null
            - attribute :
                aType : CAPATH
                mType : BIND
                src : "<CURRENT-PATH>/workspace/mnist-pyt/cert/ca/capath"
                tgt : "/swarm-cert/capath"
                subPath : null
        slhostname : sl{n}
        slhostip   : 172.1.1.1
        slport : {port}
        usrhostname : user{n}
        privatedata :
            src: "<CURRENT-PATH>/workspace/mnist-pyt/user{n}/data-and-scratch"
            mType : BIND
        slenvvars : null
        usrenvvars : null
        usrcontaineropts :
            - gpus : "all"
"""


def _reference_checkout(root: Path) -> None:
    """The files of the reference repository that README steps 2-11 use, in its layout."""
    example = root / "examples" / "mnist-pyt" / "gpu-based" / "nvidia"
    (example / "swci" / "taskdefs").mkdir(parents=True)
    (example / "swop").mkdir()
    shutil.copytree(ROOT / "examples" / "mnist-pyt" / "model", example / "model")
    (example / "swci" / "swci-init").write_text(SWCI_INIT)
    (example / "swci" / "taskdefs" / "build_pyt_user_image.yaml").write_text(BUILD_TASK)
    (example / "swci" / "taskdefs" / "run_mnist_pyt.yaml").write_text(RUN_TASK)
    nodes = "".join(PROFILE_NODE.format(idx=n - 1, n=n, port=15000 + 1000 * n) for n in range(1, 5))
    (example / "swop" / "swop_profile.yaml").write_text(PROFILE_HEAD + nodes)
    app_data = root / "examples" / "mnist-pyt" / "common" / "app-data"
    app_data.mkdir(parents=True)
    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))
    images = np.clip(np.pad(images, ((0, 0), (2, 2), (2, 2))) * 255 / 16, 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    np.savez(app_data / "mnist.npz", x_train=images[:360], y_train=labels[:360], x_test=images[-200:],
             y_test=labels[-200:])  # fmt: skip
    shutil.copytree(ROOT / "examples" / "utils", root / "examples" / "utils")


def _sh(script: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"$ {script}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _wait_for(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    pytest.fail(
        f"{text!r} not in {path}:\n{path.read_text(errors='replace')[-3000:] if path.exists() else ''}"
    )


def test_the_reference_readme_steps_2_to_11_run_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "swarm-learning"
    root.mkdir()
    _reference_checkout(root)
    state = tmp_path / "state"
    port = free_port()
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SWARM_STATE_DIR": str(state)}
    env.pop("SWARM_ID_CERT", None)
    try:
        _steps(root, state, port, env)
    finally:
        subprocess.run([BIN / "stop-swarm", "--all"], env=env, capture_output=True, check=False, timeout=120)


def _steps(root: Path, state: Path, port: int, env: dict[str, str]) -> None:
    ws = root / "workspace" / "mnist-pyt"
    # 2-3: the workspace, the private data-and-scratch of each user
    _sh(
        "mkdir workspace\n"
        "cp -r examples/mnist-pyt/gpu-based/nvidia/ workspace/mnist-pyt/\n"
        "cp -r examples/mnist-pyt/common/ workspace/mnist-pyt/data-and-scratch/\n"
        "cp -r examples/utils/gen-cert workspace/mnist-pyt/\n"
        "mkdir workspace/mnist-pyt/user1 workspace/mnist-pyt/user2 workspace/mnist-pyt/user3 "
        "workspace/mnist-pyt/user4\n"
        + "".join(
            f"cp -r workspace/mnist-pyt/data-and-scratch workspace/mnist-pyt/user{n}/\n" for n in range(1, 5)
        ),
        root,
        env,
    )
    # 4: certificates
    _sh("./workspace/mnist-pyt/gen-cert -e mnist-pyt -i 1", root, env)
    for role in ("sn", "swop", "swci", "sl"):
        assert (ws / "cert" / f"{role}-1-key.pem").is_file() and (
            ws / "cert" / f"{role}-1-cert.pem"
        ).is_file()
    assert (ws / "cert" / "ca" / "capath").is_dir()
    # 5: placeholders; and, as the README says to, this environment's SN address (IP and port)
    _sh(
        'sed -i "s+<CURRENT-PATH>+$(pwd)+g" workspace/mnist-pyt/swop/swop_profile.yaml '
        "workspace/mnist-pyt/swci/taskdefs/run_mnist_pyt.yaml\n"
        f'sed -i "s/172.1.1.1/127.0.0.1/; s/port : ~/port : {port}/" workspace/mnist-pyt/swop/swop_profile.yaml\n'
        f'sed -i "s/ip 172.1.1.1/ip 127.0.0.1 {port}/" workspace/mnist-pyt/swci/swci-init',
        root,
        env,
    )
    cert = "workspace/mnist-pyt/cert"
    # 8: the sentinel SN
    out = _sh(
        "run-sn -d --rm --name=sn1 --network=host-1-net \\\n"
        f"--host-ip=127.0.0.1 --sentinel --sn-p2p-port=30303 --sn-api-port={port} \\\n"
        f"--key={cert}/sn-1-key.pem \\\n--cert={cert}/sn-1-cert.pem \\\n--capath={cert}/ca/capath \\\n"
        "--apls-ip=127.0.0.1",
        root,
        env,
    )
    assert "--rm: no container here" in out and "--apls-ip: there is no licence server" in out
    _wait_for(state / "logs" / "sn1.log", f"Starting SWARM-API-SERVER on port: {port}")
    # 9: the SWOP
    _sh(
        "run-swop -d --rm --name=swop1 \\\n--network=host-1-net --usr-dir=workspace/mnist-pyt/swop \\\n"
        "--profile-file-name=swop_profile.yaml \\\n"
        f"--key={cert}/swop-1-key.pem \\\n--cert={cert}/swop-1-cert.pem \\\n--capath={cert}/ca/capath \\\n"
        "-e SWOP_KEEP_CONTAINERS=True \\\n-e http_proxy= -e https_proxy= --apls-ip=127.0.0.1",
        root,
        env,
    )
    _wait_for(state / "logs" / "swop1.log", "listening on taskrunner")
    # 10: SWCI runs the init script (the build task, then the run task on four nodes)
    swci = _run_swci(root, env, cert, state)
    # the four nodes share the certificate sl-1; LIST NODES showed them under their own names
    assert "Task Registered : run_mnist_pyt" in swci.stdout
    # 11: every node printed the reference's final line; the four saved models are identical
    _check_final_models(ws, state)
    # the same swci-init runs again against the same ledger: the tasks exist, finalized, with the same body
    for n in range(1, 5):
        (ws / f"user{n}" / "data-and-scratch" / "scratch" / "result.json").unlink()
    again = _run_swci(root, env, cert, state)
    for task in ("build_pyt_user_image", "run_mnist_pyt"):
        assert f"Task {task} already registered and finalized with the same body" in again.stdout
        assert f"Task {task} already finalized" in again.stdout
    _check_final_models(ws, state)


def _run_swci(root: Path, env: dict[str, str], cert: str, state: Path) -> subprocess.CompletedProcess[str]:
    swci = subprocess.run(
        [
            "bash", "-c",
            "run-swci -ti --rm --name=swci1 \\\n--network=host-1-net --usr-dir=workspace/mnist-pyt/swci \\\n"
            f"--init-script-name=swci-init --key={cert}/swci-1-key.pem \\\n--cert={cert}/swci-1-cert.pem \\\n"
            f"--capath={cert}/ca/capath -e http_proxy= \\\n-e https_proxy= --apls-ip=127.0.0.1",
        ],
        cwd=root, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    swop_log = (state / "logs" / "swop1.log").read_text(errors="replace")
    assert swci.returncode == 0, f"{swci.stdout[-6000:]}\n{swci.stderr[-2000:]}\nSWOP:\n{swop_log[-4000:]}"
    return swci


def _check_final_models(ws: Path, state: Path) -> None:
    runs = state / "data" / "swop1" / "runs" / "run_mnist_pyt"
    digests = set()
    for n in range(1, 5):
        output = (runs / f"sl{n}" / "sl.out").read_text(errors="replace")
        assert any(line.rstrip().endswith(FINAL_TEXT) for line in output.splitlines()), output[-3000:]
        scratch = ws / f"user{n}" / "data-and-scratch" / "scratch"
        assert (scratch / "mnist_final.pt").is_file(), sorted(p.name for p in scratch.parent.iterdir())
        digests.add(json.loads((scratch / "result.json").read_text())["digest"])
    assert len(digests) == 1, digests
