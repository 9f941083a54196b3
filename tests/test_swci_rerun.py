"""An init script runs again against the same ledger: what exists already in the same form is accepted.

``CREATE TASK FROM`` of a task registered with the same definition, ``FINALIZE TASK`` of a finalized
task, ``CREATE CONTRACT`` and ``CREATE TASKRUNNER`` of existing ones succeed with a plain line; a task
registered with another definition is refused with what differs and what to do. The whole example
script running twice is in ``tests/test_reference_readme.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningSN
from tests.test_swci_executor import PULL_TASK, Shell, shell  # noqa: F401 - the shell fixture

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).parents[1]


def _write_task(tmp_path: Path, text: str) -> None:
    (tmp_path / "pull_task.yaml").write_text(text)


async def test_the_same_finalized_task_is_accepted_again(shell: Shell, tmp_path: Path) -> None:  # noqa: F811 - the imported fixture
    _write_task(tmp_path, PULL_TASK)
    await shell.ok("CREATE TASK FROM pull_task.yaml")
    await shell.ok("FINALIZE TASK pull_task")
    again = await shell.ok("CREATE TASK FROM pull_task.yaml")
    assert again["existing"] is True
    assert shell.output.splitlines() == [
        "Task definition is valid",
        "Task pull_task already registered and finalized with the same body",
    ]
    await shell.ok("FINALIZE TASK pull_task")
    assert shell.output.splitlines() == ["Task pull_task already finalized"]


async def test_a_changed_finalized_task_is_refused_with_what_to_do(shell: Shell, tmp_path: Path) -> None:  # noqa: F811 - the imported fixture
    _write_task(tmp_path, PULL_TASK)
    await shell.ok("CREATE TASK FROM pull_task.yaml")
    await shell.ok("FINALIZE TASK pull_task")
    _write_task(tmp_path, PULL_TASK.replace("Tag: latest", "Tag: v2"))
    assert await shell.fails("CREATE TASK FROM pull_task.yaml") == [
        "task 'pull_task' is already registered and finalized with a different definition "
        "(body line 1 is 'Tag: latest' in the ledger, 'Tag: v2' in the file)",
        "a finalized task can neither change nor be deleted: give the new definition another Name in "
        f"{tmp_path / 'pull_task.yaml'} and use that name in FINALIZE TASK and ASSIGN TASK",
    ]
    _write_task(tmp_path, PULL_TASK.replace("Author: tester", "Author: someone"))
    assert (
        "(Author is 'tester' in the ledger, 'someone' in the file)"
        in (await shell.fails("CREATE TASK FROM pull_task.yaml"))[0]
    )


async def test_a_changed_task_not_yet_finalized_can_be_deleted_and_registered(
    shell: Shell,  # noqa: F811 - the imported fixture
    tmp_path: Path,
) -> None:
    _write_task(tmp_path, PULL_TASK)
    await shell.ok("CREATE TASK FROM pull_task.yaml")
    await shell.ok("CREATE TASK FROM pull_task.yaml")
    assert "Task pull_task already registered (not finalized yet) with the same body" in shell.output
    _write_task(tmp_path, PULL_TASK.replace("RepoName: user-env", "RepoName: x"))
    messages = await shell.fails("CREATE TASK FROM pull_task.yaml")
    assert messages[1] == f"DELETE TASK pull_task, then CREATE TASK FROM {tmp_path / 'pull_task.yaml'} again"
    await shell.ok("DELETE TASK pull_task")
    await shell.ok("CREATE TASK FROM pull_task.yaml")
    assert "Task Registered : pull_task" in shell.output


async def test_finalize_of_a_missing_task_still_fails(shell: Shell) -> None:  # noqa: F811 - the imported fixture
    messages = await shell.fails("FINALIZE TASK nothing")
    assert messages == ["no task 'nothing'; CREATE TASK it first (LIST TASKS shows the tasks)"]


async def test_existing_contracts_and_taskrunners_are_accepted(shell: Shell) -> None:  # noqa: F811 - the imported fixture
    await shell.ok("CREATE CONTRACT mnist")
    assert (await shell.ok("CREATE CONTRACT mnist"))["existing"] is True
    assert shell.output.strip() == "Contract mnist already exists"
    await shell.ok("CREATE TASKRUNNER runner.taskdb")
    assert (await shell.ok("CREATE TASKRUNNER runner.taskdb"))["existing"] is True
    assert shell.output.strip() == "Taskrunner runner.taskdb already exists"


def test_an_init_script_runs_twice_against_one_ledger(sn: RunningSN, tmp_path: Path) -> None:
    usr = tmp_path / "usr"
    (usr / "taskdefs").mkdir(parents=True)
    (usr / "taskdefs" / "pull_task.yaml").write_text(PULL_TASK)
    (usr / "swci-init").write_text(
        f"EXIT ON FAILURE\nwait for ip 127.0.0.1 {sn.port}\ncreate context t with ip 127.0.0.1 {sn.port}\n"
        "switch context t\ncd /platform/swarm/usr\ncreate contract my.contract\n"
        "create task from taskdefs/pull_task.yaml\nfinalize task pull_task\n"
        "RESET CONTRACT my.contract\nEXIT\n"
    )
    command = [sys.executable, "-m", "swci.main", "--usr-dir", str(usr), "--init-script-name", "swci-init"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first, second = (
        subprocess.run(command, capture_output=True, text=True, env=env, timeout=45, check=False)
        for _ in range(2)
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Task Registered : pull_task" in first.stdout
    assert second.returncode == 0, second.stdout + second.stderr
    assert "Task pull_task already registered and finalized with the same body" in second.stdout
    assert "Task pull_task already finalized" in second.stdout
    assert "Contract my.contract already exists" in second.stdout
