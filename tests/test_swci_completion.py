"""Completion: the pure suggest() table and the prompt-toolkit completer with live names."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from prompt_toolkit.completion import CompleteEvent, Completion
from prompt_toolkit.document import Document

from swci.argtypes import ArgKind
from swci.completion import TASK_TYPES, SwciCompleter, suggest

ROOT = [
    "APPEND", "ASSIGN", "CD", "CREATE", "DELETE", "EXIT", "FINALIZE", "GET", "HELP",
    "LIST", "LS", "PERFDATA", "PLOT", "PWD", "RESET", "REVOKE", "SET", "SLEEP", "SWITCH", "WAIT", "WATCH",
]  # fmt: skip

SUGGEST: list[tuple[str, list[str]]] = [
    ("", ROOT),
    ("   ", ROOT),
    ("cr", ["CREATE"]),
    ("CR", ["CREATE"]),
    ("l", ["LIST", "LS"]),
    ("create ", ["CONTEXT", "CONTRACT", "TASK", "TASKRUNNER"]),
    ("create task", ["TASK", "TASKRUNNER"]),
    ("create task ", ["FROM", *TASK_TYPES]),
    ("create task r", ["RUN_SWARM"]),
    ("create task from ", ["<file>"]),
    ("create task RUN_SWARM ", ["<task>"]),
    ("create context demo ", ["WITH"]),
    ("create context demo with ", ["IP", "SERVICE"]),
    ("create context demo with ip sn1 ", ["<port>"]),
    ("get ", ["BEST", "CONTEXT", "CONTRACT", "TASK", "TASKRUNNER"]),
    ("GET TASKRUNNER ", ["INFO", "PEER", "STATUS"]),
    ("perfdata c ", ["HISTORY"]),
    ("perfdata c history ", ["TO"]),
    ("watch ", ["CONTRACT"]),
    ("get taskrunner peer ", ["STATUS"]),
    ("get taskrunner peer status tr ", ["<index|uid>"]),
    ("get context info ", ["<ctx>"]),
    (
        "list ",
        [
            "CONTEXT",
            "CONTEXTS",
            "CONTRACTS",
            "NODES",
            "REVOKED",
            "TASKRUNNER",
            "TASKRUNNERS",
            "TASKS",
            "TRIALS",
        ],
    ),
    ("list taskrunner ", ["PEERS"]),
    ("assign task ", ["<task>"]),
    ("assign task t ", ["TO"]),
    ("assign task t t", ["TO"]),
    ("assign task t to ", ["<taskrunner>"]),
    ("assign task t to tr ", ["WITH", "TARGET"]),
    ("assign task t to tr with ", ["<N>", "ALL"]),
    ("assign task t to tr with 3 ", ["PEERS"]),
    ("assign task t to tr with all ", ["PEERS"]),
    ("assign task t to tr target ", ["<swop-uid>"]),
    ("assign task t to tr with 2 peers ", []),
    ("exit ", ["ON"]),
    ("exit on ", ["FAILURE"]),
    ("exit on failure ", ["ON", "OFF"]),
    ("exit on failure o", ["ON", "OFF"]),
    ("exit on failure of", ["OFF"]),
    ("wait for ", ["IP", "SERVICE", "TASKRUNNER"]),
    ("wait for ip sn1 30304 ", ["<retries>"]),
    ("wait for taskrunner tr ", ["<timeout>"]),
    ("append task body t 1 ", ["<line>"]),
    ("cd ", ["<dir>"]),
    ("ls ", ["<path>"]),
    ("help ", ROOT),
    ("help create ", ["CONTEXT", "CONTRACT", "TASK", "TASKRUNNER"]),
    ("help get taskrunner ", ["INFO", "PEER", "STATUS"]),
    ("help get taskrunner s", ["STATUS"]),
    ("help nonsense ", []),
    ("frobnicate ", []),
    ("list tasks ", []),
    ("assign task t into ", []),  # an earlier error: nothing fits
    ("list tasks # comment", []),
    ('get task info "done" ', []),
    ('get task info "done"', []),  # a closed string at the cursor is finished
    ("sleep -1 ", []),  # an invalid value before the cursor
    ("GET TASK INFO 'open ", ["<task>"]),
]


@pytest.mark.parametrize(("text", "expected"), SUGGEST, ids=[text or "<empty>" for text, _ in SUGGEST])
def test_suggest(text: str, expected: list[str]) -> None:
    assert [item.text for item in suggest(text)] == expected


def test_suggestions_carry_kind_prefix_and_meta() -> None:
    (task,) = suggest("finalize task ab")
    assert (task.kind, task.prefix, task.literal) == (ArgKind.TASK, "ab", False)
    assert task.meta == "the task name"
    (keyword,) = suggest("get taskrunner peer st")
    assert (keyword.kind, keyword.prefix, keyword.literal) == (None, "st", True)
    assert keyword.meta == "Show one SWOP's learning nodes on a taskrunner"
    create = next(item for item in suggest("") if item.text == "CREATE")
    assert create.meta == "CONTEXT, CONTRACT, TASK, TASKRUNNER"


def test_suggest_uses_the_last_line() -> None:
    assert [item.text for item in suggest("PWD\nexit o")] == ["ON"]


class FakeNames:
    """A NameSource with fixed names, recording what was asked."""

    def __init__(self) -> None:
        self.asked: list[ArgKind] = []
        self.table = {
            ArgKind.CONTEXT: ["demo", "Demo2", "prod"],
            ArgKind.TASK: ["swarm_task", "build_task", "task with space", "swarm_task"],
            ArgKind.TASKRUNNER: ["defaulttaskbb.taskdb.sml.hpe"],
            ArgKind.NODE: ["9f8e7d", "1a2b3c"],
            ArgKind.CONTRACT: ["defaultbb.cqdb.sml.hpe"],
        }

    def names(self, kind: ArgKind) -> Sequence[str]:
        self.asked.append(kind)
        return self.table.get(kind, [])


def _complete(text: str, names: FakeNames | None = None, cwd: Path | None = None) -> list[Completion]:
    completer = SwciCompleter(names, (lambda: cwd) if cwd else None)
    event = CompleteEvent(completion_requested=True)
    return list(completer.get_completions(Document(text), event))


def _texts(completions: list[Completion]) -> list[tuple[str, int]]:
    return [(item.text, item.start_position) for item in completions]


def test_keywords_complete_in_upper_case_replacing_the_typed_prefix() -> None:
    assert _texts(_complete("assign task t t")) == [("TO", -1)]
    assert _texts(_complete("get taskrunner peer st")) == [("STATUS", -2)]
    assert _complete("cr")[0].display_meta_text == "CONTEXT, CONTRACT, TASK, TASKRUNNER"


@pytest.mark.parametrize(
    ("text", "expected", "kind"),
    [
        ("switch context ", [("demo", 0), ("Demo2", 0), ("prod", 0)], ArgKind.CONTEXT),
        ("switch context de", [("demo", -2), ("Demo2", -2)], ArgKind.CONTEXT),
        ("finalize task ", [("swarm_task", 0), ("build_task", 0), ('"task with space"', 0)], ArgKind.TASK),
        ("finalize task 'task w", [('"task with space"', -7)], ArgKind.TASK),
        ("assign task swarm_task to d", [("defaulttaskbb.taskdb.sml.hpe", -1)], ArgKind.TASKRUNNER),
        ("get taskrunner peer status tr 9", [("9f8e7d", -1)], ArgKind.NODE),
        ("assign task t to tr target ", [("9f8e7d", 0), ("1a2b3c", 0)], ArgKind.NODE),
        ("perfdata ", [("defaultbb.cqdb.sml.hpe", 0)], ArgKind.CONTRACT),
    ],
)
def test_live_names_complete_from_the_name_source(
    text: str, expected: list[tuple[str, int]], kind: ArgKind
) -> None:
    names = FakeNames()
    assert _texts(_complete(text, names)) == expected
    assert names.asked == [kind]


def test_no_name_source_means_no_names() -> None:
    assert _complete("switch context ") == []


def test_numbers_and_hosts_get_no_completions() -> None:
    names = FakeNames()
    assert _complete("sleep ", names) == []
    assert _complete("wait for ip ", names) == []
    assert names.asked == []


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "taskdefs").mkdir()
    (tmp_path / "taskdefs" / "swarm.yaml").write_text("Name: x\n")
    (tmp_path / "tasks.txt").write_text("")
    (tmp_path / "my dir").mkdir()
    return tmp_path


def test_file_arguments_complete_paths_relative_to_the_session_cwd(tree: Path) -> None:
    assert _texts(_complete("create task from ta", cwd=tree)) == [("taskdefs/", -2), ("tasks.txt", -2)]
    assert _texts(_complete("create task from taskdefs/", cwd=tree)) == [("taskdefs/swarm.yaml", -9)]


def test_directory_arguments_complete_directories_only_quoting_spaces(tree: Path) -> None:
    assert sorted(_texts(_complete("cd ", cwd=tree))) == [('"my dir/', 0), ("taskdefs/", 0)]
    assert _texts(_complete('cd "my', cwd=tree)) == [('"my dir/', -3)]
