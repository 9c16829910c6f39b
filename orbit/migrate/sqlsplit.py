"""Split a migration file into statements on ``;`` outside quotes and comments.

Rules (the MySQL/MariaDB lexer's, reduced to what a migration file needs):

- ``'…'``, ``"…"`` and ```…``` are quoted; a doubled quote character stays inside the quote;
  in ``'…'`` and ``"…"`` a backslash escapes the next character (the default ``sql_mode``;
  ``NO_BACKSLASH_ESCAPES`` is not supported).
- ``--`` followed by whitespace (or the end of the text) and ``#`` start a comment that runs
  to the end of the line; ``/* … */`` is a block comment. A ``;`` or quote inside a comment
  means nothing. ``--`` followed by anything else is two minus signs, as in MySQL.
- Each statement is the exact text from its first token to its last: comments and
  whitespace before the first token and after the last are dropped, everything in between
  is kept verbatim (removing an inner comment could fuse tokens, e.g. turn ``--#x`` into a
  comment). Executable comments ``/*! … */``, ``/*M! … */`` and hints ``/*+ … */`` count as
  tokens: the server reads them.
- Statements with no token (only whitespace or comments) are dropped.
- No ``DELIMITER``: a trigger body must be a single statement (no ``BEGIN … END``).

An unterminated quote or block comment raises :class:`SqlSplitError` rather than silently
turning the rest of the file into one statement.
"""

from __future__ import annotations

_QUOTES = "'\"`"
_LINE_COMMENT_END = " \t\r\n\f\v"


class SqlSplitError(ValueError):
    """The text cannot be split: an unterminated quote or block comment.

    ``offset`` is the 0-based character offset where the quote or comment starts and
    ``line`` its 1-based line number.
    """

    def __init__(self, what: str, offset: int, line: int) -> None:
        super().__init__(f"unterminated {what} starting at line {line}")
        self.what = what
        self.offset = offset
        self.line = line


def split_statements(text: str) -> list[str]:
    """Split SQL text on ``;`` outside quotes and comments; drop empty statements.

    Guarantees: every statement is a verbatim slice of ``text`` that starts and ends with a
    token (never with whitespace or a plain comment); no statement is empty; raises
    :class:`SqlSplitError` on an unterminated quote or block comment.
    """
    out: list[str] = []
    first: int | None = None  # index of the current statement's first token
    last = 0  # index just past its last token
    i, n = 0, len(text)

    def fail(what: str, at: int) -> SqlSplitError:
        return SqlSplitError(what, at, text.count("\n", 0, at) + 1)

    while i < n:
        c = text[i]
        token_end = -1
        if c in _QUOTES:
            token_end = _quote_end(text, i)
            if token_end < 0:
                raise fail("quoted text" if c != "`" else "quoted identifier", i)
        elif c == "#" or (
            c == "-"
            and text.startswith("--", i)
            and (i + 2 >= n or text[i + 2] in _LINE_COMMENT_END)
        ):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise fail("comment", i)
            if not text.startswith(("!", "M!", "+"), i + 2):
                i = j + 2
                continue
            token_end = j + 2  # executable comment / hint: the server reads it
        elif c == ";":
            if first is not None:
                out.append(text[first:last])
            first = None
            i += 1
            continue
        elif c.isspace():
            i += 1
            continue
        else:
            token_end = i + 1
        if first is None:
            first = i
        last = i = token_end
    if first is not None:
        out.append(text[first:last])
    return out


def _quote_end(text: str, start: int) -> int:
    """Index just past the quote opened at ``start``, or -1 when it never closes."""
    q = text[start]
    i, n = start + 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and q != "`":
            i += 2
            continue
        if c == q:
            if i + 1 < n and text[i + 1] == q:  # doubled quote: a literal quote character
                i += 2
                continue
            return i + 1
        i += 1
    return -1
