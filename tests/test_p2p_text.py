"""`nvidia-smi topo -p2p` matrices: the real fixture, and hand-written matrices for the other modes in the
exact layout nvidia-smi prints (` \\tGPU0\\tGPU1\\t` header, ` GPU0\\tX\\tOK\\t` rows, then the legend)."""

from pathlib import Path

import pytest

from topoplan.errors import TopoplanError
from topoplan.topology.p2p_text import UNKNOWN_MODE, parse_p2p_text
from topoplan.topology.read import read_topology

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
FIXTURE = TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt"
LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  DR   = Disabled by regkey
  U    = Unknown
"""


def _matrix(rows: list[list[str]]) -> str:
    """A matrix as nvidia-smi prints it; rows[i][j] is the status from GPUi to GPUj."""
    n = len(rows)
    head = " \t" + "".join(f"GPU{j}\t" for j in range(n)) + "\n"
    body = "".join(f" GPU{i}\t" + "".join(f"{c}\t" for c in row) + "\n" for i, row in enumerate(rows))
    return head + body + LEGEND


def test_fixture_read_capability_all_ok():
    # fixture 14: " GPU0   X       OK" / " GPU1   OK      X"; the file itself does not name the mode
    p2p = parse_p2p_text(FIXTURE.read_text(), FIXTURE.name)
    assert p2p.statuses == {("GPU0", "GPU1"): {UNKNOWN_MODE: "OK"}}
    assert p2p.n_gpus == 2
    assert len(p2p.notes) == 1 and "nothing names this P2P matrix's mode" in p2p.notes[0]
    assert parse_p2p_text(FIXTURE.read_text(), mode="r").statuses == {("GPU0", "GPU1"): {"r": "OK"}}
    assert parse_p2p_text(FIXTURE.read_text(), mode="r").notes == ()


def test_several_modes_named_by_their_commands():
    text = ("$ nvidia-smi topo -p2p r\n" + _matrix([["X", "OK", "CNS"], ["OK", "X", "CNS"], ["CNS", "CNS", "X"]])
            + "\n$ nvidia-smi topo -p2p w\n" + _matrix([["X", "OK", "CNS"], ["OK", "X", "CNS"], ["CNS", "CNS", "X"]])
            + "\nroot@node:~# nvidia-smi topo --p2pstatus n\n"
            + _matrix([["X", "OK", "NS"], ["OK", "X", "NS"], ["NS", "NS", "X"]])
            + "\n== P2P atomics ==\n" + _matrix([["X", "TNS", "GNS"], ["TNS", "X", "GNS"], ["GNS", "GNS", "X"]])
            + "\nnvidia-smi topo -p2p p\n" + _matrix([["X", "DR", "U"], ["DR", "X", "U"], ["U", "U", "X"]]))
    p2p = parse_p2p_text(text, "p2p.txt")
    assert p2p.modes == ("r", "w", "n", "a", "p")
    assert p2p.statuses[("GPU0", "GPU1")] == {"r": "OK", "w": "OK", "n": "OK", "a": "TNS", "p": "DR"}
    assert p2p.statuses[("GPU0", "GPU2")] == {"r": "CNS", "w": "CNS", "n": "NS", "a": "GNS", "p": "U"}
    assert p2p.statuses[("GPU1", "GPU2")] == {"r": "CNS", "w": "CNS", "n": "NS", "a": "GNS", "p": "U"}
    assert p2p.notes == ()


def test_space_aligned_single_gpu_and_title_word():
    text = "P2P write capability\n        GPU0\n GPU0   X\n"
    p2p = parse_p2p_text(text)
    assert (p2p.statuses, p2p.n_gpus, p2p.modes) == ({}, 1, ("w",))


def test_asymmetric_status_keeps_the_weaker_direction_and_says_so():
    text = "nvidia-smi topo -p2p r\n" + _matrix([["X", "OK"], ["CNS", "X"]])
    p2p = parse_p2p_text(text, "p2p.txt")
    assert p2p.statuses == {("GPU0", "GPU1"): {"r": "CNS"}}
    assert p2p.notes == ("lines 3/4: P2P mode 'r' is OK for GPU0->GPU1 but CNS for GPU1->GPU0; "
                         "the pair is recorded as CNS",)


def test_two_modes_named_over_one_matrix_is_not_guessed():
    p2p = parse_p2p_text("nvidia-smi topo -p2p rw\n" + _matrix([["X", "GNS"], ["GNS", "X"]]))
    assert p2p.modes == (UNKNOWN_MODE,)
    assert "nothing names this P2P matrix's mode" in p2p.notes[0]


@pytest.mark.parametrize("text, line, message", [
    ("nvidia-smi topo -p2p r\n" + _matrix([["X", "YES"], ["OK", "X"]]), 3,
     "P2P row GPU0, column GPU1: expected one of OK, CNS, GNS, TNS, NS, DR, U, found 'YES'"),
    ("nvidia-smi topo -p2p r\n" + _matrix([["OK", "OK"], ["OK", "X"]]), 3,
     "P2P row GPU0, column GPU0: expected X (the GPU itself), found 'OK'"),
    (" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n", 2,
     "expected P2P row GPU1, found the end of the text; the matrix looks truncated"),
    (" \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n GPU1\tOK\t\n", 3, "P2P row GPU1 has 1 cells, expected 2 (one per GPU)"),
    ("-p2p r\n" + _matrix([["X", "OK"], ["OK", "X"]]) + "-p2p r\n" + _matrix([["X", "OK"], ["OK", "X"]]), 17,
     "a second P2P matrix for mode 'r' (the first is at line 2); expected one matrix per mode"),
    ("-p2p r\n" + _matrix([["X", "OK"], ["OK", "X"]]) + "-p2p w\n" + _matrix([["X"]]), 17,
     "this P2P matrix has 1 GPUs but the one above has 2; expected matrices of one machine"),
    ("hello\n", 1, "not a `nvidia-smi topo -p2p` matrix: expected a header line GPU0 GPU1 ..., found none "
                   "(the text begins 'hello')"),
], ids=["bad-status", "bad-diagonal", "truncated", "short-row", "mode-twice", "gpu-count", "not-p2p"])
def test_bad_p2p_input(text, line, message):
    with pytest.raises(TopoplanError) as info:
        parse_p2p_text(text, "p2p.txt")
    assert (info.value.source, info.value.line, info.value.message) == ("p2p.txt", line, message)


def test_read_topology_attaches_p2p(tmp_path):
    topo = read_topology(str(TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.txt"), str(FIXTURE))
    link = topo.link("GPU0", "GPU1")
    assert (link.code, dict(link.p2p)) == ("NV4", {UNKNOWN_MODE: "OK"})
    assert topo.notes == (f"{FIXTURE}: line 1: nothing names this P2P matrix's mode (r, w, n, a or p); its statuses "
                          f"are recorded under '?' (put the command, e.g. `nvidia-smi topo -p2p r`, on the line "
                          f"above it)",)

    other = tmp_path / "four.p2p.txt"
    rows = [["X" if i == j else "OK" for j in range(4)] for i in range(4)]
    other.write_text("nvidia-smi topo -p2p r\n" + _matrix(rows))
    with pytest.raises(TopoplanError) as info:
        read_topology(str(TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.txt"), str(other))
    assert info.value.source == str(other)
    assert info.value.message.startswith("the P2P matrix has 4 GPUs but the topology")


def test_an_empty_p2p_file_is_named_as_a_p2p_file(tmp_path):
    empty = tmp_path / "p2p.txt"
    empty.write_text("")
    topo = str(Path(__file__).resolve().parents[1] / "fixtures/topo/11_rtx2080ti-4gpu-all-pix.txt")
    with pytest.raises(TopoplanError) as caught:
        read_topology(topo, str(empty))
    assert caught.value.source == str(empty)
    assert caught.value.message == "the file is empty; expected the text output of `nvidia-smi topo -p2p r|w|n|a|p`"
