"""Undo what terminals, browsers and editors do to pasted `nvidia-smi` text, and rebuild its tab fields.

nvidia-smi separates cells with tabs. A paste may keep them, or carry them expanded to spaces (a
terminal copy, a README): then the tab fields are rebuilt from 8-column tab stops counted from the
row's own indent. Both `topo -m` and `topo -p2p` readers start here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topoplan.errors import TopoplanError
from topoplan.limits import MAX_LINES, MAX_TEXT_COLUMNS

TAB = 8
# Terminal escapes: nvidia-smi underlines its header (ESC[4m ... ESC[0m); a copy through a browser or
# a log often keeps the `[4m` after losing the ESC byte. Neither is data.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b|\[[0-9;]*m")
# A line holding something other than blanks (a blank line matches nothing, so runs of them cost no objects).
_CONTENT = re.compile(r"^[^\n]*\S[^\n]*", re.MULTILINE)
_MARKDOWN_ROW = re.compile(r"^\s*\|.*\|\s*$")


@dataclass(frozen=True)
class Line:
    """One line of the paste: its 1-based number in the file and its cleaned, tab-expanded text."""

    number: int
    text: str  # ANSI removed, tabs expanded to 8-column stops counted from the indent, no trailing space
    indent: int  # columns of leading whitespace
    span: int = 1  # physical lines: more than one for a wrapped row joined back together

    @property
    def joined(self) -> bool:
        """A wrapped row joined back together: its tab stops mean nothing."""
        return self.span > 1

    @property
    def last(self) -> int:
        """Number of its last physical line."""
        return self.number + self.span - 1

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def blank(self) -> bool:
        return not self.text.strip()


def clean_lines(text: str, source: str = "<text>") -> list[Line]:
    """Split a paste into lines with escapes, BOMs and non-breaking spaces removed and tabs expanded.

    The work is bounded by what the paste holds, not by its line count: a run of blank lines becomes one blank
    Line (numbered as its first), found at C speed, so a million blank lines cost nothing; more than MAX_LINES
    non-blank lines, or more than MAX_TEXT_COLUMNS characters once tabs are expanded, is refused before they are
    built."""
    # Split on line ends only (str.splitlines also splits on form feeds and the like, shifting numbers).
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines: list[Line] = []
    number, at, previous = 1, 0, 0  # the line at offset `at`; the number of the last line with content
    columns = 0  # an upper bound of the characters built so far (each tab may become 8 spaces)
    for count, match in enumerate(_CONTENT.finditer(text)):
        number += text.count("\n", at, match.start())
        if count == MAX_LINES:
            raise TopoplanError(f"more than {MAX_LINES:,} lines of text; no topology output is this long",
                                source=source, line=number)
        columns += len(match.group(0)) + 7 * match.group(0).count("\t")
        if columns > MAX_TEXT_COLUMNS:
            raise TopoplanError(f"more than {MAX_TEXT_COLUMNS >> 20} Mi characters of text once its tabs are "
                                "expanded; no topology output is this wide", source=source, line=number)
        if number > previous + 1:  # blank lines before this one: one Line stands for the run
            lines.append(Line(previous + 1, "", 0))
        lines.append(_clean(match.group(0), number))
        at, previous = match.end(), number
    tail = text[at:]
    if tail.count("\n") > tail.endswith("\n"):  # blank lines at the end (the last line end starts no line)
        lines.append(Line(previous + 1, "", 0))
    return lines


def _clean(raw: str, number: int) -> Line:
    raw = _ANSI.sub("", raw).replace("\u00a0", " ")
    lead = len(raw) - len(raw.lstrip(" \t"))
    indent = len(raw[:lead].expandtabs(TAB))
    # Tab stops count from the row's indent (a reST block indents every row by 4 columns).
    body = raw[lead:].expandtabs(TAB).rstrip()
    return Line(number, " " * indent + body, indent)


def join_lines(lines: list[Line]) -> Line:
    """One logical line from a row a terminal or editor wrapped over several lines."""
    first = lines[0]
    text = " ".join([first.text] + [line.text.strip() for line in lines[1:]])
    return Line(first.number, text, first.indent, span=lines[-1].number - first.number + 1)


def tab_fields(line: Line) -> list[str]:
    """Rebuild the tab-separated fields of an expanded line: a field starts at every tab stop (counted
    from the indent) that follows a space. An all-blank stretch between two stops is an empty field,
    which is how nvidia-smi's doubled tabs survive expansion. Fields come back stripped."""
    body = line.text[line.indent:]
    cuts = [0] + [p for p in range(TAB, len(body), TAB) if body[p - 1] == " "] + [len(body)]
    return [body[a:b].strip() for a, b in zip(cuts, cuts[1:])]


def refuse_markdown_table(lines: list[Line], source: str) -> None:
    """A Markdown table (`| GPU0 | GPU1 |`) has lost the cell layout nvidia-smi printed; say so plainly."""
    for line in lines:
        if _MARKDOWN_ROW.match(line.text) and "GPU0" in line.text:
            raise TopoplanError(
                "this is a Markdown table ('| GPU0 | ... |'), not nvidia-smi output; expected the raw text "
                "of `nvidia-smi topo -m` (paste it inside a ``` code block instead of a table)",
                source=source, line=line.number)


def quote(text: str, limit: int = 40) -> str:
    """A short, quoted excerpt of user text for an error message."""
    text = text.strip()
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
