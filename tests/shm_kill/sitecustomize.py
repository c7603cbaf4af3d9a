"""Fault injection for tests/test_shm_faults.py, loaded by every Python started with this folder first on
PYTHONPATH: when TOPOPLAN_TEST_KILL is "RANK:POINT", the process whose RANK matches SIGKILLs itself during the
shared-memory set-up of topoplan.runner.shm, at POINT:
- open: just before it opens (rank 0: creates) a /dev/shm/topoplan-* segment;
- mapped: just after it has mapped one (rank 0: created, sized and mapped, not yet unlinked).
Before dying it appends the segment's path to TOPOPLAN_TEST_KILL_LOG, so the test knows what must be gone."""

import mmap
import os
import signal

_RANK, _, _POINT = os.environ.get("TOPOPLAN_TEST_KILL", "").partition(":")

if _RANK and os.environ.get("RANK") == _RANK:
    _open, _mmap = os.open, mmap.mmap
    _segments: dict[int, str] = {}

    def _die(path: str) -> None:
        with open(os.environ["TOPOPLAN_TEST_KILL_LOG"], "a") as log:
            log.write(path + "\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def _killing_open(path, flags, *args, **kwargs):
        segment = str(path).startswith("/dev/shm/topoplan-")
        if segment and _POINT == "open":
            _die(str(path))
        fd = _open(path, flags, *args, **kwargs)
        if segment:
            _segments[fd] = str(path)
        return fd

    class _KillingMmap(_mmap):  # a subclass, so isinstance(x, mmap.mmap) still holds elsewhere
        def __new__(cls, fd, *args, **kwargs):
            mapped = super().__new__(cls, fd, *args, **kwargs)
            if fd in _segments and _POINT == "mapped":
                _die(_segments[fd])
            return mapped

    os.open, mmap.mmap = _killing_open, _KillingMmap
