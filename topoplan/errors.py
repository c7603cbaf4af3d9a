"""The one user-facing error type.

Everything the user can get wrong (a damaged paste, an unknown model, a layout that does not divide)
raises `TopoplanError`; the CLI prints it as one line on stderr and exits with `EXIT_USAGE` (2).
Anything else escaping is a bug in topoplan, and is allowed to show its traceback.
"""

from __future__ import annotations

from pathlib import Path

EXIT_USAGE = 2


def printable(text: str) -> str:
    """`text` with every character that does not print written as its escape (`\\n`, `\\x1b`, `\\u202e`): C0 and
    C1 controls (newline, ESC, BEL; CSI 0x9b), DEL, line separators, bidi overrides. What came from input (a file,
    device or model name) then stays on one line and can neither move the cursor, retitle or clear the terminal,
    nor reorder what is shown. The one helper for it; `topoplan.terminal.inert` adds rich-markup escaping."""
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class TopoplanError(Exception):
    """A problem with the user's input or environment, worded for the user.

    `source` names the file (or `<stdin>`, or a command) and `line` the 1-based line where the problem
    was found, so the message reads like a compiler's: `topo.txt:7: expected ...`.
    """

    exit_code = EXIT_USAGE

    MAX_MESSAGE = 400  # characters: a message quoting a 5,000-digit cell or a megabyte line stays one screen line

    def __init__(self, message: str, *, source: str | Path | None = None, line: int | None = None):
        message = printable(message)  # one line whatever the input held (a newline in a path, an escape in a name)
        if len(message) > self.MAX_MESSAGE:
            message = f"{message[:self.MAX_MESSAGE - 100]} [...] {message[-80:]}"
        self.message = message
        self.source = printable(str(source)) if source is not None else None
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.source or ""
        if self.source and self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.message}" if where else self.message
