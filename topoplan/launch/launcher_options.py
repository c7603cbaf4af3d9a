"""Options of the launchers themselves (the cluster, not the ranks): Slurm's partition, account, time limit and
job name, Open MPI's permission to start as root, and a Kubernetes pod's image and memory. Checked once here,
written by the renderers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from topoplan.errors import TopoplanError
from topoplan.option_fields import option

# sbatch(1) --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (and "UNLIMITED"/"INFINITE").
_SLURM_TIME = re.compile(r"(\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}|UNLIMITED|INFINITE)")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+")  # an account or partition name: one word, no shell syntax
_SLURM_NAMES = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")  # --partition a,b: the first that can start
DEFAULT_JOB_NAME = "topoplan"
# A Kubernetes memory quantity as launch writes it: whole bytes with an optional binary or decimal suffix
_MEMORY = re.compile(r"[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")


@dataclass(frozen=True)
class LauncherOptions:
    partition: str | None = field(default=None, metadata=option("--partition", help="Slurm partition (srun, "
                                                                "sbatch)."))
    account: str | None = field(default=None, metadata=option("--account", help="Slurm account (srun, sbatch)."))
    time: str | None = field(default=None, metadata=option("--time", help="Slurm time limit, e.g. 30, 1:00:00, "
                                                           "1-12:00:00."))
    job_name: str | None = field(default=None, metadata=option(  # sbatch: topoplan when not given
        "--job-name", help="Slurm job name (sbatch default: topoplan)."))
    allow_run_as_root: bool = field(default=False, metadata=option(
        "--allow-run-as-root", help="mpirun: export OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1, which Open MPI needs to start "
        "as root."))
    image: str | None = field(default=None, metadata=option("--image", help="--format lws: the engine's container "
                                                            "image."))
    pod_memory: str | None = field(default=None, metadata=option(  # request = limit: Guaranteed QoS
        "--pod-memory", help="--format lws: each pod's memory (request = limit, e.g. 900Gi), making it Guaranteed so "
        "the kubelet can pin its CPUs."))

    def __post_init__(self) -> None:
        if self.partition is not None and not _SLURM_NAMES.fullmatch(self.partition):
            raise TopoplanError(f"--partition {self.partition!r}: expected Slurm partition names (letters, digits, "
                                "_ . + -), separated by commas")
        if self.account is not None and not _SLURM_NAME.fullmatch(self.account):
            raise TopoplanError(f"--account {self.account!r}: expected one Slurm account name (letters, digits, "
                                "_ . + -)")
        if self.time is not None and not _SLURM_TIME.fullmatch(self.time):
            raise TopoplanError(f"--time {self.time!r}: expected a Slurm time limit: minutes, MM:SS, HH:MM:SS, "
                                "D-HH, D-HH:MM or D-HH:MM:SS")
        name = self.job_name
        if name is not None and (not name or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)):
            raise TopoplanError(f"--job-name {self.job_name!r}: expected a non-empty name without control characters")
        if self.image is not None and (not self.image or any(ch.isspace() or ord(ch) < 32 for ch in self.image)):
            raise TopoplanError(f"--image {self.image!r}: expected a container image reference without spaces, e.g. "
                                "vllm/vllm-openai:v0.32.0")
        if self.pod_memory is not None and not _MEMORY.fullmatch(self.pod_memory):
            raise TopoplanError(f"--pod-memory {self.pod_memory!r}: expected a Kubernetes memory quantity: a whole "
                                "number with an optional suffix Ki, Mi, Gi, Ti, Pi, k, M, G, T or P (e.g. 900Gi)")

    def slurm_args(self, job_name: str | None = None) -> list[str]:
        """The Slurm options given, as `--name=value` words (sbatch header lines, or srun options); `job_name`
        stands in when none was given."""
        pairs = (("job-name", self.job_name or job_name), ("partition", self.partition), ("account", self.account),
                 ("time", self.time))
        return [f"--{name}={value}" for name, value in pairs if value is not None]
