"""A finding: one check's verdict on one thing, with the evidence it rests on and the fix.

Severities, mildest first: ok, unknown (the source could not be read; the reason is the evidence), note,
slows, blocks. The exit status of `topoplan doctor` is set by the worst (EXIT_CODES; docs/doctor.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

SEVERITIES = ("ok", "unknown", "note", "slows", "blocks")
GROUPS = ("peer-to-peer", "network", "memory", "CPU", "containers")
# 1 is what Python gives an uncaught exception and 2 is topoplan's user error: a finding never looks like either.
EXIT_CODES = {"ok": 0, "unknown": 0, "note": 0, "slows": 3, "blocks": 4}


@dataclass(frozen=True)
class Finding:
    check: str  # the check's id, e.g. "pcie-link"
    group: str  # what it protects: one of GROUPS
    severity: str  # one of SEVERITIES
    subject: str  # what was judged: "GPU 0000:17:00.0", "/dev/shm", "mlx5_0 port 1"
    message: str  # the verdict in words
    evidence: str  # the source (file or NVML field) and its value
    fix: str = ""  # the command or setting that fixes it; "" when nothing is wrong

    def __post_init__(self) -> None:
        assert self.severity in SEVERITIES and self.group in GROUPS, (self.severity, self.group)

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def worst(findings: Iterable[Finding]) -> str:
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")


def exit_code(findings: Iterable[Finding]) -> int:
    return EXIT_CODES[worst(findings)]
