"""The worked examples in docs/launch*.md are what `topoplan launch` prints today."""

import subprocess
import sys

from launch_support import ROOT


def test_launch_docs_are_current():
    done = subprocess.run([sys.executable, "docs/gen_launch_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + "\nrun: python docs/gen_launch_docs.py"
