"""Start N local rank processes, stream rank 0's output, and make one failure end them all.

General on purpose (`topoplan run` and `topoplan bench` both use it): any argv, any per-rank extra
environment. Like torchrun on one node, it gives each process RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, picks a free rendezvous port and retries with another
if that port was taken before rank 0 could bind it. Imports no torch.
"""

from __future__ import annotations

import codecs
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import IO

from topoplan.errors import TopoplanError
from topoplan.limits import max_local_ranks
from topoplan.runner.shm_names import JOB_ENV, new_job_tag, remove_job_segments

PORT_TAKEN = ("address already in use", "eaddrinuse")
POLL_S = 0.05
STOP_GRACE_S = 2.0  # after SIGTERM, the seconds a rank gets to exit before SIGKILL
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Stopped(TopoplanError):
    """The parent was interrupted (SIGINT) or terminated (SIGTERM): the ranks were ended, exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; every rank was ended")
        self.exit_code = 128 + signum


def exit_code(returncode: int) -> int:
    """A child's return code as a shell reports it: killed by signal N (Popen's -N) is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _die_with_parent(parent: int, cpus: tuple[int, ...] | None) -> None:
    """In the child before exec: ask the kernel to SIGKILL it when the parent dies (however it dies, even by
    SIGKILL, so no rank is left orphaned), then pin it to its CPUs as taskset would."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's own signal handling still ends the ranks
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
    if cpus:
        os.sched_setaffinity(0, cpus)


def free_port() -> int:
    """A port the kernel says is free now (another process may still take it before rank 0 binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SpawnResult:
    returncode: int  # 0 when every rank succeeded, else the first failing rank's code (124: timed out;
    # 128 + N: killed by signal N, as a shell reports it)
    failed_rank: int | None = None
    stdout: str = ""  # rank 0's standard output when captured
    stderr: list[str] = field(default_factory=list)  # every rank's standard error lines, "[rank N] ..."


def _pump(stream: IO[bytes], rank: int, sink: IO[str] | None, lines: list[str], raw: bool) -> None:
    """Copy one process's output to `sink` as it comes; keep its lines in `lines`.

    raw=True copies chunks unchanged (rank 0's progress bar redraws lines in place); otherwise each line
    is prefixed with the rank."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # chunks may split a character
    pending = ""
    while chunk := stream.read1(65536):
        text = decoder.decode(chunk)
        if raw and sink is not None:
            sink.write(text)
            sink.flush()
        *complete, pending = (pending + text).split("\n")
        for line in complete:
            lines.append(f"[rank {rank}] {line}")
            if not raw and sink is not None:
                sink.write(f"[rank {rank}] {line}\n")
                sink.flush()
    if pending:  # a last line without a newline
        lines.append(f"[rank {rank}] {pending}")
        if not raw and sink is not None:
            sink.write(f"[rank {rank}] {pending}\n")


def signal_note(result: SpawnResult) -> str | None:
    """'rank 1 was killed by SIGKILL' when the failing rank died of a signal, else None."""
    if result.failed_rank is None or not 128 < result.returncode < 128 + 65 or result.returncode == 124:
        return None
    try:
        name = signal.Signals(result.returncode - 128).name
    except ValueError:
        return None
    return f"rank {result.failed_rank} was killed by {name}"


def _stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM whoever is still running, then SIGKILL after `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(procs: list[subprocess.Popen], timeout_s: float | None, grace_s: float) -> tuple[int | None, int]:
    """Wait for every rank; (the failing rank that caused the end or None, its exit code as a shell reports it,
    or 124 after `timeout_s`). See `_cause` for which failure is the cause."""
    start, failures, failed_at, stopped, timed_out = time.monotonic(), {}, 0.0, False, False
    while None in (codes := [proc.poll() for proc in procs]):  # poll every rank, not just the first running
        if not stopped:
            _note_failures(codes, failures)
            failed_at = failed_at or (time.monotonic() if failures else 0.0)
        if failures and not stopped and time.monotonic() - failed_at > grace_s:
            _stop(procs, grace_s=STOP_GRACE_S)  # the others did not end on their own: end them
            stopped = True
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            _stop(procs, grace_s=STOP_GRACE_S)
            stopped = timed_out = True
        time.sleep(POLL_S)
    if not stopped:  # every rank ended on its own: all their codes count
        _note_failures(codes, failures)
    failed, code = _cause(failures)
    return failed, 124 if timed_out else code


def _note_failures(codes: list[int | None], failures: dict[int, int]) -> None:
    """Add the ranks that ended with an error to `failures` (rank -> Popen return code), in the order seen."""
    for rank, returncode in enumerate(codes):
        if returncode not in (None, 0) and rank not in failures:
            failures[rank] = returncode


def _cause(failures: dict[int, int]) -> tuple[int | None, int]:
    """The failure that ended the job: a rank killed by a signal we did not send (SIGKILL, the OOM killer)
    before any that exited with an error, since its peers then fail with 1 ("peer has ended") and may be
    reaped first; else the first seen. (None, 0) when none failed."""
    if not failures:
        return None, 0
    rank = next((r for r, returncode in failures.items() if returncode < 0), next(iter(failures)))
    return rank, exit_code(failures[rank])


@contextmanager
def _terminate_raises() -> Iterator[None]:
    """While ranks run, SIGTERM to us raises Stopped (as Ctrl-C raises KeyboardInterrupt), so the ranks are
    ended before we exit. Only the main thread can set handlers; elsewhere the ranks' PDEATHSIG still works."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_stopped(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        yield
    except KeyboardInterrupt:
        raise Stopped(signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_once(world_size: int, argv: Sequence[str], env_per_rank: Callable[[int], Mapping[str, str]] | None,
              cpus_per_rank: Callable[[int], Sequence[int] | None] | None, timeout_s: float | None, grace_s: float,
              capture_stdout: bool, echo: bool, port: int,
              cwd: str | None) -> SpawnResult:
    """One try of spawn_ranks: start every rank, wait for all, then unlink the shared-memory segments a killed
    rank left (topoplan.runner.shm_names), whatever ended the ranks."""
    procs: list[subprocess.Popen] = []
    threads = []
    parent = os.getpid()
    job = new_job_tag()
    out_lines: list[str] = []
    err_lines: list[list[str]] = [[] for _ in range(world_size)]
    for rank in range(world_size):
        env = {**os.environ,
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),  # rendezvous on loopback: one machine
               "RANK": str(rank), "WORLD_SIZE": str(world_size),  # who am I, read by topoplan.rank_env
               "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),  # all ranks are on this node
               JOB_ENV: job,  # names their /dev/shm segments, so we can remove what a killed rank left
               **(env_per_rank(rank) if env_per_rank else {})}
        cpus = cpus_per_rank(rank) if cpus_per_rank else None
        # Before exec: die with us, and pin as taskset would (threads and first allocations on its own CPUs).
        proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=partial(_die_with_parent, parent, tuple(cpus or ())))
        procs.append(proc)
        out_sink = None if capture_stdout else (sys.stdout if rank == 0 else sys.stderr)
        threads.append(threading.Thread(target=_pump, args=(proc.stdout, rank, out_sink if echo else None,
                                                             out_lines if rank == 0 else err_lines[rank],
                                                             rank == 0), daemon=True))
        threads.append(threading.Thread(target=_pump, args=(proc.stderr, rank, sys.stderr if echo else None,
                                                             err_lines[rank], rank == 0), daemon=True))
    for thread in threads:
        thread.start()
    try:
        failed, code = _wait(procs, timeout_s, grace_s)
    except BaseException:  # Ctrl-C, SIGTERM (see _terminate_raises), or a bug: never leave ranks behind
        _stop(procs, grace_s=STOP_GRACE_S)
        raise
    finally:
        remove_job_segments(job)  # every rank has been reaped: nothing maps them by name any more
    for thread in threads:
        thread.join()
    stdout = "\n".join(line.split("] ", 1)[1] for line in out_lines)
    return SpawnResult(code, failed, stdout + ("\n" if out_lines else ""), [l for ls in err_lines for l in ls])


def spawn_ranks(world_size: int, argv: Sequence[str], *, env_per_rank: Callable[[int], Mapping[str, str]] | None = None,
                cpus_per_rank: Callable[[int], Sequence[int] | None] | None = None,
                timeout_s: float | None = None, grace_s: float = 10.0, capture_stdout: bool = False,
                echo: bool = True, port_retries: int = 3, cwd: str | None = None) -> SpawnResult:
    """Run `argv` as ranks 0..world_size-1 on this machine and wait for all of them.

    Rank 0's stdout goes to ours (or is captured), every rank's stderr to ours (rank 0's unprefixed, the
    others' prefixed "[rank N]"). When a rank fails, the others get `grace_s` to end on their own (the
    runner's timeouts make them), then are terminated. After `timeout_s` everything is stopped and the
    result's code is 124. `cpus_per_rank` pins each rank to its CPUs from the moment it starts."""
    if not 1 <= world_size <= max_local_ranks():
        raise TopoplanError(f"{world_size} ranks: expected 1 to {max_local_ranks()} on this machine "
                            f"(8 per CPU; more only time-slice and exhaust memory)")
    for _ in range(port_retries):
        with _terminate_raises():
            result = _run_once(world_size, argv, env_per_rank, cpus_per_rank, timeout_s, grace_s, capture_stdout,
                               echo, free_port(), cwd)
        taken = any(marker in line.lower() for line in result.stderr for marker in PORT_TAKEN)
        if result.returncode == 0 or not taken:
            return result
    return result
