"""The SWCI parser: every command form, keyword case, located errors, the canonical swci-init."""

from __future__ import annotations

import re

import pytest

from swci.commands import (
    AppendTaskBody,
    AssignTask,
    Cd,
    Command,
    CreateContext,
    CreateContextService,
    CreateContract,
    CreateTask,
    CreateTaskFrom,
    CreateTaskrunner,
    DeleteTask,
    Exit,
    ExitOnFailure,
    FinalizeTask,
    GetContextEnv,
    GetContextInfo,
    GetContextVersion,
    GetContractInfo,
    GetContractStatus,
    GetTaskBody,
    GetTaskInfo,
    GetTaskrunnerInfo,
    GetTaskrunnerPeerStatus,
    GetTaskrunnerStatus,
    Help,
    ListContextEnv,
    ListContexts,
    ListContracts,
    ListNodes,
    ListRevokedIdentities,
    ListTaskrunnerPeers,
    ListTaskrunners,
    ListTasks,
    Ls,
    Perfdata,
    PerfdataHistory,
    PlotContract,
    Pwd,
    ResetContract,
    ResetTaskrunner,
    RevokeIdentity,
    SetContextEnv,
    Sleep,
    SwitchContext,
    WaitForIp,
    WaitForService,
    WaitForTaskrunner,
    WatchContract,
)
from swci.errors import ScriptError, SwciSyntaxError
from swci.grammar import REGISTRY
from swci.parser import parse_line, parse_script
from swci.tokenizer import TokenKind, tokenize
from swci.trials import GetBestTrial, ListTrials, PlotTrials

TR = "defaulttaskbb.taskdb.sml.hpe"
BB = "defaultbb.cqdb.sml.hpe"

VALID: list[tuple[str, Command]] = [
    # contexts
    ("CREATE CONTEXT demo WITH IP sn1", CreateContext("demo", "sn1")),
    ("create context demo with ip 10.1.2.3 30304", CreateContext("demo", "10.1.2.3", 30304)),
    ("create context demo 10.1.2.3", CreateContext("demo", "10.1.2.3")),
    ("create context demo 10.1.2.3 40000", CreateContext("demo", "10.1.2.3", 40000)),
    ("CREATE CONTEXT demo WITH SERVICE api.sn-1.swarm", CreateContextService("demo", "api.sn-1.swarm")),
    ("CREATE CONTEXT demo WITH SERVICE api.swarm:443", CreateContextService("demo", "api.swarm:443")),
    ("SWITCH CONTEXT Demo", SwitchContext("Demo")),
    ("GET CONTEXT INFO", GetContextInfo(None)),
    ("GET CONTEXT INFO demo", GetContextInfo("demo")),
    ("GET CONTEXT ENV demo SOME_VAR", GetContextEnv("demo", "SOME_VAR")),
    ("SET CONTEXT ENV demo SOME_VAR 'a value'", SetContextEnv("demo", "SOME_VAR", "a value")),
    ("SET CONTEXT ENV demo SOME_VAR 60", SetContextEnv("demo", "SOME_VAR", "60")),
    ("LIST CONTEXT ENV demo", ListContextEnv("demo")),
    ("GET CONTEXT VERSION", GetContextVersion()),
    ("LIST CONTEXTS", ListContexts()),
    # contracts
    ("CREATE CONTRACT c1", CreateContract("c1")),
    (f"GET CONTRACT INFO {BB}", GetContractInfo(BB)),
    (f"GET CONTRACT STATUS {BB}", GetContractStatus(BB)),
    ("LIST CONTRACTS", ListContracts()),
    (f"PERFDATA {BB}", Perfdata(BB)),
    (f"perfdata {BB} history", PerfdataHistory(BB)),
    (f"PERFDATA {BB} HISTORY TO out/h.csv", PerfdataHistory(BB, "out/h.csv")),
    (f"WATCH CONTRACT {BB}", WatchContract(BB)),
    (f"watch contract {BB} 90", WatchContract(BB, 90.0)),
    (f"PLOT CONTRACT {BB}", PlotContract(BB)),
    (f"PLOT CONTRACT {BB} TO plots", PlotContract(BB, "plots")),
    (f"RESET CONTRACT {BB}", ResetContract(BB)),
    # tasks
    (
        "CREATE TASK RUN_SWARM t1 alice ROOTTASK out1",
        CreateTask("RUN_SWARM", "t1", "alice", "ROOTTASK", "out1"),
    ),
    ("create task from taskdefs/swarm_task.yaml", CreateTaskFrom("taskdefs/swarm_task.yaml")),
    ('create task from "my dir/task.yaml"', CreateTaskFrom("my dir/task.yaml")),
    ("APPEND TASK BODY t1 1 FROM python:3.11", AppendTaskBody("t1", 1, "FROM python:3.11")),
    (
        "APPEND TASK BODY t1 2 RUN pip install x  # keep  ",
        AppendTaskBody("t1", 2, "RUN pip install x  # keep"),
    ),
    ("APPEND TASK BODY t1 3 '   keras pandas '", AppendTaskBody("t1", 3, "   keras pandas ")),
    ('APPEND TASK BODY t1 4 RUN echo "unbalanced', AppendTaskBody("t1", 4, 'RUN echo "unbalanced')),
    ("APPEND TASK BODY t1 5 # a Dockerfile comment", AppendTaskBody("t1", 5, "# a Dockerfile comment")),
    ("DELETE TASK t1", DeleteTask("t1")),
    ("FINALIZE TASK t1", FinalizeTask("t1")),
    ("GET TASK BODY t1", GetTaskBody("t1")),
    ("GET TASK INFO t1", GetTaskInfo("t1")),
    ("LIST TASKS", ListTasks()),
    # taskrunners
    ("CREATE TASKRUNNER tr1", CreateTaskrunner("tr1")),
    (f"ASSIGN TASK t1 TO {TR} WITH 2 PEERS", AssignTask("t1", TR, peers=2)),
    (f"assign task t1 to {TR} with all peers", AssignTask("t1", TR, all_peers=True)),
    (f"ASSIGN TASK t1 TO {TR} TARGET 9f8e7d", AssignTask("t1", TR, target="9f8e7d")),
    (f"GET TASKRUNNER INFO {TR}", GetTaskrunnerInfo(TR)),
    (f"GET TASKRUNNER STATUS {TR}", GetTaskrunnerStatus(TR)),
    (f"GET TASKRUNNER PEER STATUS {TR} 0", GetTaskrunnerPeerStatus(TR, 0)),
    (f"GET TASKRUNNER PEER STATUS {TR} 9f8e7d", GetTaskrunnerPeerStatus(TR, "9f8e7d")),
    ("LIST TASKRUNNERS", ListTaskrunners()),
    (f"LIST TASKRUNNER PEERS {TR}", ListTaskrunnerPeers(TR)),
    (f"RESET TASKRUNNER {TR}", ResetTaskrunner(TR)),
    (f"WAIT FOR TASKRUNNER {TR}", WaitForTaskrunner(TR)),
    (f"WAIT FOR TASKRUNNER {TR} 90", WaitForTaskrunner(TR, 90.0)),
    # trials (ours)
    ("LIST TRIALS bagging", ListTrials("bagging")),
    ("get best trial bagging", GetBestTrial("bagging")),
    ("PLOT TRIALS bagging", PlotTrials("bagging")),
    ("PLOT TRIALS bagging TO plots/out", PlotTrials("bagging", "plots/out")),
    # miscellaneous
    ("HELP", Help(None)),
    ("help assign task", Help(("ASSIGN", "TASK"))),
    ("CD /platform/swarm/usr", Cd("/platform/swarm/usr")),
    ("ls", Ls(None)),
    ("LS taskdefs", Ls("taskdefs")),
    ("pwd", Pwd()),
    ("EXIT", Exit()),
    ("EXIT ON FAILURE", ExitOnFailure(on=True)),
    ("EXIT ON FAILURE ON", ExitOnFailure(on=True)),
    ("exit on failure off", ExitOnFailure(on=False)),
    ("LIST NODES", ListNodes()),
    ("REVOKE IDENTITY sl-2", RevokeIdentity("sl-2")),
    ('revoke identity sl-2 "lost key"', RevokeIdentity("sl-2", "lost key")),
    ("LIST REVOKED IDENTITIES", ListRevokedIdentities()),
    ("SLEEP 15", Sleep(15.0)),
    ("SLEEP 0.5", Sleep(0.5)),
    ("SLEEP 0", Sleep(0.0)),
    ("wait for ip sn1", WaitForIp("sn1")),
    ("WAIT FOR IP sn1 30304", WaitForIp("sn1", 30304)),
    ("WAIT FOR IP sn1 30304 12", WaitForIp("sn1", 30304, 12)),
    ("WAIT FOR SERVICE api.swarm", WaitForService("api.swarm")),
    ("WAIT FOR SERVICE api.swarm:8443 3", WaitForService("api.swarm:8443", 3)),
    # comments, whitespace, quoting
    ("  LIST TASKS   # all of them", ListTasks()),
    ("\tGET TASK INFO 'task with spaces'", GetTaskInfo("task with spaces")),
    ('GET TASK INFO "a \\"quoted\\" name"', GetTaskInfo('a "quoted" name')),
    ("GET TASK INFO 123", GetTaskInfo("123")),
    ("SWITCH CONTEXT Ünïcödé", SwitchContext("Ünïcödé")),
]


@pytest.mark.parametrize(("line", "expected"), VALID, ids=[line for line, _ in VALID])
def test_every_command_form_parses(line: str, expected: Command) -> None:
    assert parse_line(line) == expected


def test_every_command_has_a_form_in_the_table() -> None:
    tested = {type(command) for _, command in VALID}
    registered = {kind for spec in REGISTRY for kind in spec.command_types}
    assert registered <= tested


@pytest.mark.parametrize("line", ["", "   ", "# only a comment", "  \t # indented comment"])
def test_blank_and_comment_lines_are_none(line: str) -> None:
    assert parse_line(line) is None


def _swap_keyword_case(line: str, style: str) -> str:
    out = line
    tokens = tokenize(line)
    if line.upper().startswith("APPEND"):
        tokens = tokens[:3]  # the body line is raw text, not keywords
    for token in reversed(tokens):
        if token.kind is TokenKind.WORD and token.value.upper() in REGISTRY.keywords:
            word = {"lower": token.text.lower(), "upper": token.text.upper()}.get(
                style, "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(token.text))
            )
            start = token.column - 1
            out = out[:start] + word + out[start + len(token.text) :]
    return out


EXAMPLES = [(spec, example) for spec in REGISTRY for example in spec.examples]


@pytest.mark.parametrize(("spec", "example"), EXAMPLES, ids=[ex for _, ex in EXAMPLES])
def test_registry_examples_parse_to_their_command(spec: object, example: str) -> None:
    parsed = parse_line(example)
    assert parsed is not None
    assert type(parsed) in REGISTRY.spec_for(parsed).command_types
    assert REGISTRY.spec_for(parsed) is spec


@pytest.mark.parametrize("style", ["lower", "upper", "mixed"])
@pytest.mark.parametrize("line", [line for line, _ in VALID])
def test_keywords_are_case_insensitive_names_keep_case(line: str, style: str) -> None:
    assert parse_line(_swap_keyword_case(line, style)) == parse_line(line)


def test_names_keep_their_case() -> None:
    assert parse_line("finalize task MyTask") == FinalizeTask("MyTask")
    assert parse_line("FINALIZE TASK mytask") == FinalizeTask("mytask")


ERRORS: list[tuple[str, int, str]] = [
    # (line, column, message)
    ("ASSIGN TASK my_task INTO tr WITH 2 PEERS", 21, "expected TO after the task name, got 'INTO'"),
    ("ASSIGN TASK t TO tr", 21, "expected WITH or TARGET after the taskrunner name, got end of line"),
    ("ASSIGN TASK t TO tr WITH PEERS", 26, "expected the number of peers or ALL after WITH, got 'PEERS'"),
    (
        "ASSIGN TASK t TO tr WITH 2 PEER",
        28,
        "expected PEERS after the number of peers, got 'PEER' (did you mean PEERS?)",
    ),
    ("ASSIGN TASK t TO tr WITH 0 PEERS", 26, "the number of peers must be at least 1, got 0"),
    ("ASSIGN TASK t TO tr WITH 1.5 PEERS", 26, "the number of peers must be a whole number, got 1.5"),
    ("ASSIGN TASK t TO tr TARGET", 28, "expected the SWOP UID after TARGET, got end of line"),
    ("ASIGN TASK t TO tr WITH 2 PEERS", 1, "unknown command 'ASIGN'; did you mean ASSIGN TASK?"),
    ("frobnicate", 1, "unknown command 'frobnicate'; type HELP to list the commands"),
    ("'LIST' TASKS", 1, "unknown command \"'LIST'\""),
    (
        "GET TASKRUNER STATUS tr",
        5,
        "expected BEST, CONTEXT, CONTRACT, TASK or TASKRUNNER after GET, got 'TASKRUNER' "
        "(did you mean TASKRUNNER?)",
    ),
    ("GET TASKRUNNER", 16, "expected INFO, PEER or STATUS after GET TASKRUNNER, got end of line"),
    ("LIST TASKRUNNER tr", 17, "expected PEERS after LIST TASKRUNNER, got 'tr'"),
    ("EXIT ON", 9, "expected FAILURE after EXIT ON, got end of line"),
    ("EXIT NOW", 6, "expected ON or end of line after EXIT, got 'NOW'"),
    ("EXIT ON FAILURE MAYBE", 17, "expected ON, OFF or end of line after EXIT ON FAILURE, got 'MAYBE'"),
    ("CREATE TASK", 13, "expected the task type or FROM after CREATE TASK, got end of line"),
    ("CREATE TASK FRM x.yaml", 24, "(did you mean CREATE TASK FROM?)"),
    ("CREATE TASK FROM", 18, "expected the task definition file after CREATE TASK FROM, got end of line"),
    ('create task from "my file.yaml', 18, 'unterminated string: missing the closing "'),
    ("CREATE CONTEXT c WITH", 23, "expected IP or SERVICE after WITH, got end of line"),
    ("CREATE CONTEXT c WITH IP h 0", 28, "the port must be between 1 and 65535, got 0"),
    ("CREATE CONTEXT c WITH IP h 65536", 28, "the port must be between 1 and 65535, got 65536"),
    (
        "CREATE CONTEXT c WITH SERVICE api:99999",
        31,
        "the port of the service name must be between 1 and 65535, got '99999'",
    ),
    ("CREATE CONTEXT c WITH SERVICE :443", 31, "the service name needs a host name before ':'"),
    (
        "WAIT FOR IP sn1 port",
        17,
        "expected the port or end of line after the IP address or host name, got 'port'",
    ),
    ("WAIT FOR IP sn1 80 -1", 20, "the number of retries must be at least 0, got -1"),
    ("WAIT FOR TASKRUNNER tr -5", 24, "the timeout in seconds must not be negative, got -5"),
    ("GET CONTEXT INFO a b", 20, "expected end of line after the context name, got 'b'"),
    ("SLEEP", 7, "expected the number of seconds after SLEEP, got end of line"),
    ("SLEEP soon", 7, "expected the number of seconds after SLEEP, got 'soon'"),
    ("SLEEP -1", 7, "the number of seconds must not be negative, got -1"),
    ("APPEND TASK BODY t 0 RUN x", 20, "the line number must be at least 1, got 0"),
    ("APPEND TASK BODY t 1", 22, "expected the body line after the line number, got end of line"),
    ("APPEND TASK BODY t one RUN x", 20, "expected the line number after the task name, got 'one'"),
    ("GET TASKRUNNER PEER STATUS tr -1", 31, "the SWOP index or UID must be at least 0, got -1"),
    ("GET TASK INFO ''", 15, "the task name must not be empty"),
    ("LIST TASKS now", 12, "expected end of line after LIST TASKS, got 'now'"),
    (
        "CREATE TASK RUN_SWARM t a p",
        29,
        "expected the outcome after the prerequisite task (ROOTTASK for none), got end of line",
    ),
]


@pytest.mark.parametrize(("line", "column", "message"), ERRORS, ids=[line for line, _, _ in ERRORS])
def test_errors_say_where_and_what_was_expected(line: str, column: int, message: str) -> None:
    with pytest.raises(SwciSyntaxError) as caught:
        parse_line(line, line_no=7)
    error = caught.value
    assert (error.line, error.column) == (7, column)
    assert message in error.message
    assert error.excerpt == line


def test_error_text_has_location_excerpt_and_caret() -> None:
    with pytest.raises(SwciSyntaxError) as caught:
        parse_line("ASSIGN TASK my_task INTO tr WITH 2 PEERS")
    assert str(caught.value) == (
        "line 1, col 21: expected TO after the task name, got 'INTO' (did you mean TO?)\n"
        "  ASSIGN TASK my_task INTO tr WITH 2 PEERS\n"
        "                      ^^^^"
    )


def test_caret_at_end_of_line_and_after_tabs() -> None:
    with pytest.raises(SwciSyntaxError) as caught:
        parse_line("\tSLEEP")
    assert caught.value.caret == "\t      ^"
    assert caught.value.column == 8


def test_several_lines_in_one_line_are_an_error() -> None:
    with pytest.raises(SwciSyntaxError, match="one command per line"):
        parse_line("PWD\nLS")


def test_trailing_newline_is_fine() -> None:
    assert parse_line("PWD\n") == Pwd()


CANONICAL_INIT = """\
# the reference system's canonical swci-init (examples/mnist/swci/swci-init)
EXIT ON FAILURE
wait for ip sn1
create context test-mnist with ip sn1
switch context test-mnist
EXIT ON FAILURE OFF
cd /platform/swarm/usr
EXIT ON FAILURE
create task from taskdefs/user_env_tf_build_task.yaml
finalize task user_env_tf_build_task
get task info user_env_tf_build_task
get task body user_env_tf_build_task
list tasks
EXIT ON FAILURE OFF
EXIT ON FAILURE
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
ASSIGN TASK user_env_tf_build_task TO defaulttaskbb.taskdb.sml.hpe WITH 2 PEERS
WAIT FOR TASKRUNNER defaulttaskbb.taskdb.sml.hpe
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
EXIT ON FAILURE OFF
EXIT ON FAILURE
create task from taskdefs/swarm_mnist_task.yaml
finalize task swarm_mnist_task
get task info swarm_mnist_task
get task body swarm_mnist_task
list tasks
EXIT ON FAILURE OFF
EXIT ON FAILURE
RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
ASSIGN TASK swarm_mnist_task TO defaulttaskbb.taskdb.sml.hpe WITH 2 PEERS
WAIT FOR TASKRUNNER defaulttaskbb.taskdb.sml.hpe
SLEEP 15

RESET TASKRUNNER defaulttaskbb.taskdb.sml.hpe
EXIT ON FAILURE OFF
EXIT ON FAILURE
LIST CONTRACTS
RESET CONTRACT defaultbb.cqdb.sml.hpe
EXIT ON FAILURE OFF
EXIT
"""


def test_canonical_swci_init_parses_completely() -> None:
    commands = parse_script(CANONICAL_INIT, source="swci-init")
    assert len(commands) == 38
    assert commands[0] == (2, ExitOnFailure(on=True))
    assert commands[2] == (4, CreateContext("test-mnist", "sn1"))
    assert commands[15] == (17, AssignTask("user_env_tf_build_task", TR, peers=2))
    assert commands[-1] == (40, Exit())
    assert (32, Sleep(15.0)) in commands


def test_parse_script_collects_every_error() -> None:
    script = "PWD\nASIGN TASK t\n# fine\nSLEEP\r\nLIST TASKS\n"
    with pytest.raises(ScriptError) as caught:
        parse_script(script, source="init.swci")
    errors = caught.value.errors
    assert [(e.line, e.column) for e in errors] == [(2, 1), (4, 7)]
    assert all(e.source == "init.swci" for e in errors)
    assert str(errors[0]).startswith("init.swci: line 2, col 1: unknown command 'ASIGN'")
    assert str(caught.value).startswith("2 syntax errors in init.swci:\n")


def test_parse_script_handles_bom_and_crlf() -> None:
    assert parse_script("\ufeffPWD\r\nLS\r\n") == [(1, Pwd()), (2, Ls())]


def test_tokens_carry_line_and_column() -> None:
    tokens = tokenize("GET  'a b' 12 \"x\\ty\" # c", line=3)
    assert [(t.kind, t.value, t.line, t.column) for t in tokens] == [
        (TokenKind.WORD, "GET", 3, 1),
        (TokenKind.STRING, "a b", 3, 6),
        (TokenKind.NUMBER, "12", 3, 12),
        (TokenKind.STRING, "x\ty", 3, 15),
    ]


def test_hash_inside_a_word_is_no_comment() -> None:
    assert [t.value for t in tokenize("ls a#b # c")] == ["ls", "a#b"]


def test_unterminated_string_is_an_error_token() -> None:
    (token,) = tokenize("'abc")
    assert token.kind is TokenKind.ERROR
    assert "missing the closing '" in token.value


SYNTAX = {
    ("ASSIGN", "TASK"): (
        "ASSIGN TASK <task> TO <taskrunner> WITH <N> PEERS",
        "ASSIGN TASK <task> TO <taskrunner> WITH ALL PEERS",
        "ASSIGN TASK <task> TO <taskrunner> TARGET <swop-uid>",
    ),
    ("CREATE", "CONTEXT"): (
        "CREATE CONTEXT <ctx> WITH IP <ip> [<port>]",
        "CREATE CONTEXT <ctx> WITH SERVICE <fqdn[:port]>",
    ),
    ("EXIT", "ON", "FAILURE"): ("EXIT ON FAILURE [ON | OFF]",),
    ("WAIT", "FOR", "IP"): ("WAIT FOR IP <ip> [<port> [<retries>]]",),
    ("HELP",): ("HELP [<command> ...]",),
}


@pytest.mark.parametrize("path", list(SYNTAX))
def test_syntax_lines_come_from_the_grammar(path: tuple[str, ...]) -> None:
    spec = REGISTRY.get(path)
    assert spec is not None
    assert spec.syntax_lines == SYNTAX[path]


def test_every_command_is_documented() -> None:
    for spec in REGISTRY.visible():
        assert spec.summary, spec.name
        assert spec.help, spec.name
        assert spec.examples, spec.name
        assert re.fullmatch(r"[A-Z][^\n]*[^.]", spec.summary), spec.name
