"""docs/library.md's Python example runs as written (from the repository root, without typer's CLI)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_python_example_runs(tmp_path):
    text = (ROOT / "docs" / "library.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    code += "\nimport sys\nassert 'typer' not in sys.modules and 'torch' not in sys.modules\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    first, stages = done.stdout.splitlines()[:2]
    assert first.startswith("tp=8,pp=1,dp=1 (range(0, 80),)") and first.endswith("ms/token")
    assert stages == "[{'pp_rank': 0, 'first_layer': 0, 'last_layer': 79, 'layers': 80}]"
    assert "torchrun --nnodes=1 --node-rank=0 --nproc-per-node=8" in done.stdout
