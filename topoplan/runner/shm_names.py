"""Names of the runner's shared-memory segments (/dev/shm/topoplan-...), so the process that started the ranks
can remove what they left. Imports no torch: topoplan.runner.spawn uses it.

Why: rank 0 creates a segment and unlinks its name once every member has mapped it (topoplan.runner.shm), but a
rank killed between the creation and the unlink (SIGKILL, the OOM killer) runs no cleanup of its own. A spawner
gives its ranks a job tag (JOB_ENV); every segment they create is named `topoplan-<tag>-<random>`, and once the
ranks are reaped the spawner unlinks whatever still carries its tag: only its own job's segments, never those of
another run on the same machine. Ranks started by another launcher (torchrun, mpirun, srun) have no tag; their
segments are still unlinked by rank 0 on every path where it survives.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping

SHM_DIR = "/dev/shm"
PREFIX = "topoplan-"
JOB_ENV = "TOPOPLAN_SHM_JOB"  # set by topoplan.runner.spawn for the ranks it starts: their segments' job tag
_TAG = re.compile(r"[0-9a-f]{32}")


def new_job_tag() -> str:
    """A fresh job tag for the ranks of one spawn."""
    return uuid.uuid4().hex


def new_segment_name(environ: Mapping[str, str] | None = None) -> str:
    """A new segment's file name: `topoplan-<tag>-<random>` under a spawner's job tag, `topoplan-<random>` else
    (a value that is not a tag, e.g. set by hand, is ignored: it never reaches a path)."""
    tag = (os.environ if environ is None else environ).get(JOB_ENV, "")
    return f"{PREFIX}{tag}-{uuid.uuid4().hex}" if _TAG.fullmatch(tag) else f"{PREFIX}{uuid.uuid4().hex}"


def remove_job_segments(tag: str) -> list[str]:
    """Unlink every segment of job `tag` still in /dev/shm (the ranks must have ended); returns their names."""
    try:
        names = [name for name in os.listdir(SHM_DIR) if name.startswith(f"{PREFIX}{tag}-")]
    except OSError:  # no /dev/shm (not Linux): the ranks used no shared memory
        return []
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:  # unlinked meanwhile
            pass
    return removed
