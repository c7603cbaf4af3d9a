"""SVG/PNG pictures: the DOT source laid out by Graphviz's `dot` program, written atomically."""

from __future__ import annotations

import shutil
import subprocess

from topoplan.atomic import atomic_path
from topoplan.errors import TopoplanError


def render_image(dot_source: str, fmt: str, output: str) -> None:
    """Run `dot -T<fmt>` on the source and put the picture at `output` (all or nothing)."""
    dot = shutil.which("dot")
    if dot is None:
        raise TopoplanError(f"--format {fmt} needs Graphviz's `dot` program, which is not on PATH "
                            "(Debian/Ubuntu: apt-get install graphviz); --format dot prints the source instead")
    with atomic_path(output) as tmp:
        done = subprocess.run([dot, f"-T{fmt}", "-o", tmp], input=dot_source.encode(), capture_output=True,
                              check=False)
        if done.returncode != 0:
            first = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
            raise TopoplanError(f"Graphviz `dot -T{fmt}` failed: {first}")
