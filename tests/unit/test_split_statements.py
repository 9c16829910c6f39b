"""split_statements: quotes, escapes, comments, executable comments, triggers, bad text."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from orbit.migrate import SqlSplitError, load_migrations, split_statements
from orbit.migrate.files import default_migrations_dir
from orbit.migrate.runner import split_statements as runner_split


def test_runner_keeps_exporting_split_statements() -> None:
    assert runner_split is split_statements


def test_plain_statements_with_and_without_trailing_semicolon() -> None:
    assert split_statements("CREATE TABLE a (x INT);\nCREATE TABLE b (y INT)") == [
        "CREATE TABLE a (x INT)",
        "CREATE TABLE b (y INT)",
    ]


def test_empty_and_comment_only_text_gives_nothing() -> None:
    assert split_statements("") == []
    assert split_statements(" ;\n ; ;") == []
    assert split_statements("-- only a comment; really\n# another;\n/* and ; this */") == []


def test_semicolons_inside_strings_and_identifiers_do_not_split() -> None:
    sql = "INSERT INTO t VALUES ('a;b', \"c;d\");SELECT `we;ird` FROM t"
    assert split_statements(sql) == [
        "INSERT INTO t VALUES ('a;b', \"c;d\")",
        "SELECT `we;ird` FROM t",
    ]


@pytest.mark.parametrize(
    "literal",
    [
        "'it''s; fine'",  # doubled quote
        r"'it\'s; fine'",  # backslash-escaped quote
        r"'ends with a backslash\\'",  # escaped backslash right before the closing quote
        '"say ""hi""; ok"',
        r'"say \"hi\"; ok"',
        "`col``name;x`",  # doubled backtick in an identifier
        r"`back\slash`",  # no backslash escapes inside backticks
    ],
)
def test_escaped_quotes_stay_inside_the_literal(literal: str) -> None:
    assert split_statements(f"SELECT {literal};SELECT 2") == [f"SELECT {literal}", "SELECT 2"]


def test_comments_around_statements_are_dropped_inner_ones_kept_verbatim() -> None:
    sql = (
        "-- header; with a semicolon\n"
        "CREATE TABLE a (\n"
        "  x INT, -- trailing; comment\n"
        "  y INT  # hash; comment\n"
        ");\n"
        "/* block ; comment\n spanning lines */ SELECT 1;"
    )
    assert split_statements(sql) == [
        "CREATE TABLE a (\n  x INT, -- trailing; comment\n  y INT  # hash; comment\n)",
        "SELECT 1",
    ]


def test_double_dash_without_space_is_not_a_comment() -> None:
    assert split_statements("SELECT 1--1;SELECT 2") == ["SELECT 1--1", "SELECT 2"]
    assert split_statements("SELECT 1 --\nSELECT 2") == ["SELECT 1 --\nSELECT 2"]
    assert split_statements("SELECT 1 --;x") == ["SELECT 1 --", "x"]
    assert split_statements("SELECT 1 --") == ["SELECT 1"]  # at the end of text: a comment


def test_inner_comments_stay_so_tokens_never_fuse() -> None:
    assert split_statements("SELECT 1/*x*/FROM dual") == ["SELECT 1/*x*/FROM dual"]
    # Dropping the '#' comment would make "--" + newline a comment and swallow nothing but
    # change the meaning; dropping the block comment would turn "--" + " x" into a comment.
    assert split_statements("SELECT 1--#c\n2") == ["SELECT 1--#c\n2"]
    assert split_statements("SELECT 1--/*c*/ 2;") == ["SELECT 1--/*c*/ 2"]


def test_executable_comments_and_hints_are_kept() -> None:
    sql = (
        "/*!40101 SET NAMES utf8mb4 */;SELECT /*+ MAX_EXECUTION_TIME(1) */ 1;/*M!100500 SELECT 2 */"
    )
    assert split_statements(sql) == [
        "/*!40101 SET NAMES utf8mb4 */",
        "SELECT /*+ MAX_EXECUTION_TIME(1) */ 1",
        "/*M!100500 SELECT 2 */",
    ]


def test_single_statement_trigger_bodies() -> None:
    sql = """
    CREATE TRIGGER trg_events_no_update BEFORE UPDATE ON orbit_events FOR EACH ROW
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is immutable; no UPDATE';
    CREATE TRIGGER trg_events_no_delete BEFORE DELETE ON orbit_events FOR EACH ROW
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is immutable';
    """
    out = split_statements(sql)
    assert len(out) == 2
    assert out[0].endswith("MESSAGE_TEXT = 'orbit_events is immutable; no UPDATE'")
    assert out[1].startswith("CREATE TRIGGER trg_events_no_delete BEFORE DELETE")


@pytest.mark.parametrize(
    ("sql", "what", "line"),
    [
        ("SELECT 1;\nSELECT 'open", "quoted text", 2),
        ('SELECT 1;\n\nSELECT "open\\"', "quoted text", 3),
        ("SELECT `open", "quoted identifier", 1),
        ("SELECT 1; /* never closed ;", "comment", 1),
    ],
)
def test_unterminated_quote_or_comment_is_an_error(sql: str, what: str, line: int) -> None:
    with pytest.raises(SqlSplitError) as info:
        split_statements(sql)
    assert info.value.what == what
    assert info.value.line == line
    assert isinstance(info.value, ValueError)


def test_every_shipped_migration_file_splits() -> None:
    for f in load_migrations(default_migrations_dir()):
        statements = f.statements
        assert all(s.strip() == s and s for s in statements), f.name
        assert not any(s.upper().startswith("DELIMITER") for s in statements), f.name


# -- properties ----------------------------------------------------------------------------

_TEXT = st.text(alphabet="ab;'\"`\\\n-#/*! ", max_size=12)
_WORDS = st.sampled_from(
    ["SELECT", "CREATE TABLE t", "x", "1", "(", ")", ",", "=", "-", "/", "*", "1-1"]
)


@st.composite
def _literal(draw: st.DrawFn) -> str:
    body = draw(_TEXT)
    style = draw(st.sampled_from(["double", "backslash", "dq", "dq_backslash", "ident"]))
    if style == "double":
        return "'" + body.replace("\\", "\\\\").replace("'", "''") + "'"
    if style == "backslash":
        return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if style == "dq":
        return '"' + body.replace("\\", "\\\\").replace('"', '""') + '"'
    if style == "dq_backslash":
        return '"' + body.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "`" + body.replace("`", "``") + "`"


_STATEMENT = st.lists(st.one_of(_WORDS, _literal()), min_size=1, max_size=6).map(" ".join)
_FILLER = st.sampled_from(
    ["", " ", "\n", "\n\n", "-- note; x\n", "# note; 'x\n", "/* a ; ' b */", "; ", "--\n"]
)


@given(st.lists(st.tuples(_STATEMENT, _FILLER), max_size=6), _FILLER, st.booleans())
def test_property_statements_round_trip(
    parts: list[tuple[str, str]], lead: str, trailing_semicolon: bool
) -> None:
    """Statements joined with ';' and comments/empty statements between them come back."""
    text = lead
    for i, (stmt, filler) in enumerate(parts):
        last = i == len(parts) - 1
        text += stmt + (";" if not last or trailing_semicolon else "\n") + filler
    assert split_statements(text) == [stmt for stmt, _ in parts]


@given(st.text(alphabet="ab ;'\"`\\\n-#/*!+M", max_size=60))
def test_property_split_is_stable(text: str) -> None:
    """Statements are verbatim slices of the text, never empty or padded, and splitting the
    re-joined output gives them back."""
    try:
        out = split_statements(text)
    except SqlSplitError:
        assume(False)
        return
    assert all(s and s == s.strip() and s in text for s in out)
    # Re-join with ';' right after each statement: a statement may end in "--", which is an
    # operator before ';' but a comment before a newline or the end of the text (as in MySQL).
    assert split_statements("".join(f"{s};" for s in out)) == out
