"""Printing rich tables at the width the terminal (or COLUMNS) gives, with no trailing spaces on any line, and
keeping what came from input inert on the way there.

rich pads every cell and title to the table's width; a pasted table then carries invisible spaces that
diff tools and review comments trip over. Rendering to text first and stripping each line's end (before
any closing colour code) keeps the colours and drops the padding.
"""

from __future__ import annotations

import re

from rich.console import Console, RenderableType
from rich.markup import escape
from rich.text import Text

from topoplan.errors import printable

_TRAILING = re.compile(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


def strip_trailing(text: str) -> str:
    """Every line of `text` without its trailing blanks (colour codes after them are kept)."""
    return _TRAILING.sub(r"\1", text)


def inert(text: object) -> str:
    """`text` (a device, file or model name from input) ready for a rich table cell or title, which rich reads as
    markup: control characters written as escapes (`printable`), `[` escaped so `[/]` or `[bold]` print as
    themselves instead of raising MarkupError or restyling the table."""
    return escape(printable(str(text)))


def emit(console: Console, *renderables: RenderableType | str) -> None:
    """Print `renderables` on `console` at its width, each line stripped of trailing blanks. Plain strings are
    printed as text, never read as markup, their control characters escaped (they often quote input); the line
    breaks they are written with stay."""
    with console.capture() as captured:
        for renderable in renderables:
            if isinstance(renderable, str):
                renderable = Text("\n".join(printable(line) for line in renderable.split("\n")))
            console.print(renderable, highlight=False)
    console.file.write(strip_trailing(captured.get()))
    console.file.flush()
