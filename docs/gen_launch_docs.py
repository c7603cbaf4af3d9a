"""Regenerate the worked examples in docs/launch*.md by running `topoplan launch` itself.

Each example is a marker line `<!-- run: topoplan launch ARGS -->` followed by a fenced block; the block is
replaced by what the command prints (stdout, then stderr for --explain). Run from the repository root:

    python docs/gen_launch_docs.py          # rewrite the pages
    python docs/gen_launch_docs.py --check  # exit 1 if a page is out of date (tests/test_launch_docs.py)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"(<!-- run: topoplan (?P<args>[^\n]*?) -->\n```(?P<lang>\w*)\n)(?P<body>.*?)(```)", re.S)


def run(args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "topoplan", *shlex.split(args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "COLUMNS": "160", "TERM": "dumb"})
    if done.returncode != 0:
        raise SystemExit(f"topoplan {args} failed:\n{done.stderr}")
    text = done.stdout + (done.stderr if "--explain" in args else "")
    return "".join(line.rstrip() + "\n" for line in text.splitlines())  # rich pads titles with spaces


def regenerate(text: str) -> str:
    return MARKER.sub(lambda m: m.group(1) + run(m.group("args")) + m.group(5), text)


def main(check: bool) -> int:
    stale = []
    for page in sorted((ROOT / "docs").glob("launch*.md")):
        old = page.read_text()
        new = regenerate(old)
        if new != old:
            stale.append(page.name)
            if not check:
                page.write_text(new)
    if stale:
        print(("out of date: " if check else "rewrote: ") + ", ".join(stale))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
