"""Property tests: no input makes the parser, the completer or the highlighter crash."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swci.commands import Command
from swci.completion import suggest
from swci.errors import SwciSyntaxError
from swci.grammar import REGISTRY
from swci.highlight import fragments
from swci.parser import parse_line

EXTRA = [
    "create context demo 10.1.2.3 40000",
    "APPEND TASK BODY t1 2 RUN pip install x  # keep",
    "APPEND TASK BODY t1 3 '   keras pandas '",
    'GET TASK INFO "a \\"quoted\\" name"',
    "  LIST TASKS   # all of them",
    "EXIT ON FAILURE OFF",
]
SEEDS = sorted({example for spec in REGISTRY for example in spec.examples} | set(EXTRA))
POOL = [
    *sorted(REGISTRY.keywords),
    "0",
    "-1",
    "1.5",
    "65536",
    "99999999999999999999",
    "''",
    '""',
    "'",
    '"',
    "#",
    "\\",
    "a:b",
    ":",
    "x:0",
    "ROOTTASK",
    "ünï",
    "名前",
    "\x00",
    "\t",
    "🙂",
    "'un terminated",
]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(line: str) -> None:
    error: SwciSyntaxError | None = None
    try:
        parsed = parse_line(line, line_no=3)
    except SwciSyntaxError as exc:
        error, parsed = exc, None
    assert parsed is None or isinstance(parsed, Command)
    if error is not None:
        assert error.line == 3
        assert error.column >= 1
        assert error.message
        assert str(error).startswith(f"line 3, col {error.column}: ")


@st.composite
def mutated(draw: st.DrawFn) -> str:
    words = draw(st.sampled_from(SEEDS)).split(" ")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "insert", "replace", "char"]))
        index = draw(st.integers(0, max(len(words) - 1, 0)))
        if op == "delete" and words:
            del words[index]
        elif op == "insert":
            words.insert(index, draw(st.sampled_from(POOL) | st.text(max_size=6)))
        elif op == "replace" and words:
            words[index] = draw(st.sampled_from(POOL) | st.text(max_size=6))
        else:
            line = " ".join(words)
            at = draw(st.integers(0, len(line)))
            words = (line[:at] + draw(st.text(max_size=2)) + line[at + 1 :]).split(" ")
    return " ".join(words)


@SETTINGS
@given(mutated())
def test_mutated_lines_raise_only_syntax_errors(line: str) -> None:
    _check(line)


@SETTINGS
@given(st.text())
def test_random_unicode_raises_only_syntax_errors(line: str) -> None:
    _check(line)


@SETTINGS
@given(mutated() | st.text())
def test_completion_and_highlighting_never_fail(line: str) -> None:
    for item in suggest(line):
        assert item.text
    for cut in (len(line) // 2, len(line)):
        suggest(line[:cut])
    if "\n" not in line:
        assert "".join(fragment[1] for fragment in fragments(line)) == line
