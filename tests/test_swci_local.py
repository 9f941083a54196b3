"""Local commands, HELP, result rendering, the validator and the highlighter."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from prompt_toolkit.document import Document
from prompt_toolkit.validation import ValidationError
from rich.console import Console

from swci.commands import Cd, Exit, ExitOnFailure, Help, ListTasks, Ls, Pwd, Sleep
from swci.grammar import REGISTRY
from swci.help import find_help, help_data, render_help
from swci.highlight import fragments
from swci.local_commands import LocalExecutor
from swci.output import Result, Table, render, to_json
from swci.session import SessionState
from swci.validation import SwciValidator


def _text(renderable: object, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "taskdefs").mkdir()
    (tmp_path / "taskdefs" / "b.yaml").write_text("")
    (tmp_path / "A.txt").write_text("")
    return tmp_path


async def test_cd_pwd_and_ls(tree: Path) -> None:
    local, session = LocalExecutor(), SessionState(cwd=tree)
    assert (await local.execute(Ls(), session)).data == ["A.txt", "taskdefs/"]
    assert (await local.execute(Cd("taskdefs"), session)).ok
    assert session.cwd == tree / "taskdefs"
    assert (await local.execute(Pwd(), session)).messages == [str(tree / "taskdefs")]
    assert (await local.execute(Ls(".."), session)).messages == ["A.txt", "taskdefs/"]
    assert (await local.execute(Ls("b.yaml"), session)).messages == ["b.yaml"]
    assert (await local.execute(Cd(".."), session)).ok
    assert session.cwd == tree


async def test_cd_and_ls_failures_say_why(tree: Path) -> None:
    local, session = LocalExecutor(), SessionState(cwd=tree)
    missing = await local.execute(Cd("nowhere"), session)
    assert (missing.ok, missing.messages) == (False, [f"no such directory: {tree / 'nowhere'}"])
    not_dir = await local.execute(Cd("A.txt"), session)
    assert not_dir.messages == [f"not a directory: {tree / 'A.txt'}"]
    assert not (await local.execute(Ls("nowhere"), session)).ok
    assert session.cwd == tree


async def test_platform_usr_dir_maps_to_the_usr_dir(tree: Path) -> None:
    local, session = LocalExecutor(), SessionState(cwd=Path("/"), usr_dir=tree)
    assert (await local.execute(Cd("/platform/swarm/usr"), session)).ok
    assert session.cwd == tree
    assert session.resolve_path("/platform/swarm/usr/taskdefs/b.yaml") == tree / "taskdefs" / "b.yaml"
    assert session.resolve_path("x.yaml") == tree / "x.yaml"
    assert session.resolve_path("/platform/swarm/usrx") == Path("/platform/swarm/usrx")


async def test_session_commands_change_the_session() -> None:
    local, session = LocalExecutor(), SessionState()
    assert (await local.execute(ExitOnFailure(on=True), session)).ok
    assert session.exit_on_failure
    await local.execute(ExitOnFailure(on=False), session)
    assert not session.exit_on_failure
    assert (await local.execute(Sleep(0.0), session)).ok
    await local.execute(Exit(), session)
    assert session.exit_requested


async def test_networked_commands_fail_clearly_and_are_not_local() -> None:
    result = await LocalExecutor().execute(ListTasks(), SessionState())
    assert result == Result(False, ["LIST TASKS needs a connection to a Swarm Network node"])
    assert not LocalExecutor.handles(ListTasks())
    assert LocalExecutor.handles(Pwd())


async def test_help_results() -> None:
    local, session = LocalExecutor(), SessionState()
    everything = await local.execute(Help(), session)
    assert everything.ok
    assert everything.table is not None
    assert len(everything.table.rows) == len(REGISTRY.visible()) == 48
    assert everything.table.rows[0][:2] == ("Contexts", "CREATE CONTEXT")
    assert everything.table.rows[-1][0] == "Session and files"
    unknown = await local.execute(Help(("ASIGN",)), session)
    assert not unknown.ok
    assert unknown.messages == ["no command matches 'ASIGN'; did you mean ASSIGN TASK?"]


@pytest.mark.parametrize(
    ("topic", "names", "exact"),
    [
        (("assign", "task"), ["ASSIGN TASK"], True),
        (("EXIT",), ["EXIT", "EXIT ON FAILURE"], True),
        (("exit", "on"), ["EXIT ON FAILURE"], True),
        (("ASSIGN", "TASK", "extra"), ["ASSIGN TASK"], True),
        (
            ("create",),
            [
                "CREATE CONTEXT",
                "CREATE CONTRACT",
                "CREATE TASK",
                "CREATE TASK FROM",
                "CREATE TASKRUNNER",
            ],
            False,
        ),
        (
            ("GET", "TASKRUNNER"),
            ["GET TASKRUNNER INFO", "GET TASKRUNNER STATUS", "GET TASKRUNNER PEER STATUS"],
            False,
        ),
        (("nonsense",), [], False),
    ],
)
def test_find_help(topic: tuple[str, ...], names: list[str], exact: bool) -> None:
    found = find_help(topic)
    assert sorted(spec.name for spec in found.specs) == sorted(names)
    assert found.exact is exact


def test_help_renders_families_details_and_suggestions() -> None:
    overview = _text(render_help(None))
    for family in ("Contexts", "Contracts", "Tasks", "Taskrunners", "Session and files"):
        assert family in overview
    assert "WAIT FOR TASKRUNNER" in overview
    details = _text(render_help(("create", "context")))
    assert "CREATE CONTEXT <ctx> WITH SERVICE <fqdn[:port]>" in details
    assert "Examples" in details
    assert "pre-2.0" in details
    assert "did you mean PERFDATA?" in _text(render_help(("PERFDAT",)))
    assert help_data(("sleep",))["commands"][0]["syntax"] == ["SLEEP <seconds>"]


@dataclass(frozen=True)
class _Peer:
    uid: str
    path: Path


def test_text_rendering_of_messages_tables_and_errors() -> None:
    table = Table.of("Tasks", ["NAME", "STATE"], [["build", "FINALIZED"], ["train", None]])
    out = _text_of(Result.success("2 tasks", table=table))
    assert out.splitlines()[0] == "2 tasks"
    assert "Tasks" in out
    assert "FINALIZED" in out
    assert _text_of(Result.failure("no such task: [x]")) == "no such task: [x]\n"


def _text_of(result: Result) -> str:
    console = Console(file=io.StringIO(), width=80, color_system=None)
    render(result, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def test_json_rendering_is_one_object_per_command() -> None:
    table = Table.of(None, ["A"], [[1]])
    result = Result.success("hi", table=table, data={"peer": _Peer("u1", Path("/x")), "kinds": {"b", "a"}})
    console = Console(file=io.StringIO(), width=20, color_system=None)
    render(result, console, "json", command="LIST TASKS")
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert out.count("\n") == 1
    assert json.loads(out) == {
        "command": "LIST TASKS",
        "ok": True,
        "messages": ["hi"],
        "table": {"title": None, "columns": ["A"], "rows": [[1]]},
        "data": {"peer": {"uid": "u1", "path": "/x"}, "kinds": ["a", "b"]},
    }
    assert json.loads(to_json(Result.failure("bad")))["ok"] is False


def test_validator_points_at_the_offending_token() -> None:
    validator = SwciValidator()
    text = "ASSIGN TASK t INTO tr WITH 2 PEERS"
    with pytest.raises(ValidationError) as caught:
        validator.validate(Document(text))
    assert caught.value.cursor_position == text.index("INTO")
    assert caught.value.message.startswith("expected TO after the task name")
    validator.validate(Document("ASSIGN TASK t TO tr WITH 2 PEERS"))
    validator.validate(Document("# just a comment"))


@pytest.mark.parametrize(
    "text", ["ASSIGN TASK t TO", "ASSIGN TASK t TO tr WITH 2 PEE", "GET TASK INFO 'a b", "cre"]
)
async def test_validator_is_quiet_while_the_line_is_unfinished(text: str) -> None:
    validator = SwciValidator()
    await validator.validate_async(Document(text))
    with pytest.raises(ValidationError):
        validator.validate(Document(text))


async def test_validator_reports_errors_before_the_typed_word_while_typing() -> None:
    with pytest.raises(ValidationError) as caught:
        await SwciValidator().validate_async(Document("SLEEP -1 x"))
    assert caught.value.cursor_position == 6


def test_highlighting_styles_keywords_numbers_strings_and_comments() -> None:
    styled = fragments("assign task 'my task' TO tr WITH 2 PEERS # go")
    assert ("class:keyword", "assign") in styled
    assert ("class:string", "'my task'") in styled
    assert ("class:number", "2") in styled
    assert ("class:comment", "# go") in styled
    assert ("", "tr") in styled
    assert fragments("sleep 'x")[-1] == ("class:error", "'x")
