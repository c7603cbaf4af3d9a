"""Bad input gets one TopoplanError naming the file, the line and what was expected; damage whose intended
matrix is still certain is recovered, and a note says so."""

from pathlib import Path

import pytest

from topoplan.errors import TopoplanError
from topoplan.topology.read import read_topology
from topoplan.topology.smi_text import NVLINK_HIDDEN, parse_topo_text

TOPO = Path(__file__).resolve().parent.parent / "fixtures" / "topo"
T4 = (TOPO / "40_t4-4gpu-sys-node-driver-2020-nolegend.txt").read_text()
DGX1 = (TOPO / "07_dgx1-v100-sxm2-16gb-cubemesh-mlx5-driver440.txt").read_text()
B300 = (TOPO / "01_b300-sxm6-8gpu-nv18-9nic-sglang.txt").read_text()
PAIR = ("\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV4\t0-7\t0\t\tN/A\n"
        "GPU1\tNV4\t X \t0-7\t0\t\tN/A\n")


def _write(tmp_path: Path, content, name="topo.txt") -> str:
    path = tmp_path / name
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return str(path)


def _error(tmp_path: Path, content, name="topo.txt") -> TopoplanError:
    path = _write(tmp_path, content, name)
    with pytest.raises(TopoplanError) as info:
        read_topology(path)
    error = info.value
    assert error.source == path
    assert str(error) == f"{path}:{error.line}: {error.message}"  # the one-line shape the CLI prints
    return error


def test_not_a_topo_matrix(tmp_path):
    error = _error(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    assert error.line == 1
    assert error.message.startswith("not a `nvidia-smi topo -m` matrix: expected a header line of column names "
                                    "starting with GPU0, found none (the text begins 'NVIDIA-SMI has failed")


def test_truncated_paste_missing_rows(tmp_path):
    error = _error(tmp_path, "\n".join(T4.splitlines()[:3]) + "\n")  # header, GPU0, GPU1 of 4 GPUs
    assert error.line == 3
    assert error.message == "expected row GPU2 after this line, found the end of the text; the paste looks truncated"


def test_truncated_paste_cut_mid_row(tmp_path):
    text = "\n".join(T4.splitlines()[:3]) + "\nGPU2    SYS     NODE"
    error = _error(tmp_path, text)
    assert error.line == 4
    assert error.message == ("row GPU2 has 2 cells, expected 4 (one per column GPU0..GPU3); "
                             "the row looks truncated or damaged")


def test_truncated_nic_row(tmp_path):
    text = "\n".join(DGX1.splitlines()[:9]) + "\nmlx5_0  NODE    NODE    PIX\n"  # the NIC row cut short
    error = _error(tmp_path, text)
    assert error.line == 10
    assert error.message.startswith("row mlx5_0 has 3 cells, expected 9 (one per column GPU0..mlx5_0)")


def test_nic_rows_partly_missing(tmp_path):
    minsky = (TOPO / "20_power8-minsky-p100-4gpu-nv2-soc-oldlegend.txt").read_text().splitlines()
    del minsky[6]  # the mlx5_1 row; mlx5_0's row is kept, so NIC rows were printed and one is lost
    error = _error(tmp_path, "\n".join(minsky))
    assert error.line == 8
    assert error.message == "expected row mlx5_1 (the header names 6 devices), found 'Legend:'"


def test_damaged_row_lost_cell(tmp_path):
    lines = DGX1.splitlines()
    lines[3] = lines[3].replace("NV2      X      NV2", "NV2      X     ", 1)  # GPU2 row loses its GPU3 cell
    error = _error(tmp_path, "\n".join(lines))
    assert error.line == 4
    assert error.message == ("row GPU2, column mlx5_0: unknown link code '0-11,24-35'; "
                             "expected one of X, NV<n>, PIX, PXB, PHB, NODE, SYS (or the old SOC)")


def test_asymmetric_matrix(tmp_path):
    lines = T4.splitlines()
    lines[3] = lines[3].replace("SYS     NODE     X", "SYS     SYS      X")  # GPU2 says GPU1 is SYS
    error = _error(tmp_path, "\n".join(lines))
    assert error.line == 4
    assert error.message == ("the matrix is not symmetric: row GPU2 says GPU2-GPU1 is SYS, but row GPU1 (line 3) "
                             "says NODE; expected the same code both ways")


@pytest.mark.parametrize("code", ["PCIE", "NV0", "NV-2", "QPI"])
def test_unknown_code(tmp_path, code):
    error = _error(tmp_path, PAIR.replace("NV4\t X", f"{code}\t X"))
    assert error.line == 3
    assert error.message == (f"row GPU1, column GPU0: unknown link code {code!r}; "
                             f"expected one of X, NV<n>, PIX, PXB, PHB, NODE, SYS (or the old SOC)")


def test_self_cell_must_be_x(tmp_path):
    error = _error(tmp_path, PAIR.replace("GPU1\tNV4\t X ", "GPU1\tNV4\tNV4"))
    assert (error.line, error.message) == (3, "row GPU1, column GPU1: expected X (the device itself), found 'NV4'")


def test_p2p_matrix_passed_as_topology(tmp_path):
    error = _error(tmp_path, (TOPO / "14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt").read_text())
    assert error.line == 2
    assert "'OK' is a `nvidia-smi topo -p2p` status, not a link code" in error.message
    assert "pass it with --p2p" in error.message


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_empty_file(tmp_path, content):
    error = _error(tmp_path, content)
    assert (error.line, error.message) == (1, "the file is empty; expected the text output of `nvidia-smi topo -m`")


def test_binary_junk(tmp_path):
    error = _error(tmp_path, b"GPU0 GPU1\nGPU0 X NV4\n\x00\x01\x02\x03ELF\x7f")
    assert error.line == 3
    assert error.message == ("binary data (control byte 0x00), not text; expected the text output of "
                             "`nvidia-smi topo -m`")


def test_not_utf8(tmp_path):
    error = _error(tmp_path, b"\tGPU0\n\xff\xd8\xff\xe0 JFIF")
    assert error.line == 2
    assert error.message == "not UTF-8 text (byte 0xff); expected the text output of `nvidia-smi topo -m`"


def test_markdown_table(tmp_path):
    text = "| | GPU0 | GPU1 | CPU Affinity |\n|---|---|---|---|\n| GPU0 | X | NV4 | 0-7 |\n| GPU1 | NV4 | X | 0-7 |\n"
    error = _error(tmp_path, text)
    assert error.line == 1
    assert error.message.startswith("this is a Markdown table ('| GPU0 | ... |'), not nvidia-smi output; "
                                    "expected the raw text of `nvidia-smi topo -m`")


def test_row_without_header(tmp_path):
    error = _error(tmp_path, "\n".join(T4.splitlines()[1:]))
    assert error.line == 1
    assert error.message.startswith("found matrix row GPU0 with no header line above it")


def test_unknown_header_column(tmp_path):
    error = _error(tmp_path, PAIR.replace("NUMA Affinity", "NUMA Afinity"))
    assert error.line == 1
    assert error.message.startswith("header: unexpected column name 'NUMA'")


def test_bad_cpu_list(tmp_path):
    error = _error(tmp_path, PAIR.replace("GPU1\tNV4\t X \t0-7", "GPU1\tNV4\t X \t7-0"))
    assert (error.line, error.message) == (
        3, "row GPU1, CPU Affinity: expected a CPU list such as 0-15,32-47 or N/A, found '7-0'")


def test_missing_trailing_value(tmp_path):
    error = _error(tmp_path, PAIR.replace("GPU1\tNV4\t X \t0-7\t0\t\tN/A", "GPU1\tNV4\t X \t0-7\t0"))
    assert error.line == 3
    assert error.message == ("row GPU1: expected values for CPU Affinity, NUMA Affinity, GPU NUMA ID after the "
                             "link cells, found '0-7 0'")


def test_missing_file():
    with pytest.raises(TopoplanError) as info:
        read_topology("/nonexistent/topo.txt")
    assert info.value.source == "/nonexistent/topo.txt" and info.value.line is None
    assert info.value.message == "cannot read it: No such file or directory"


def test_json_is_refused_for_now(tmp_path):
    error = _error(tmp_path, '{"gpus": []}')
    assert error.line == 1 and error.message.startswith("JSON, but not a topoplan NVML recording")


# --- recovered damage: right values, and a note -------------------------------------------------------
def test_fused_cells_recovered_with_note():
    text = PAIR.replace("GPU0\t X \tNV4\t0-7", "GPU0\t X NV4\t0-7").replace("\tNV4\t X ", "\tNV4 X ")
    topo = parse_topo_text(DGX1.replace("NV1     NV1     NV2     NV2", "NV1     NV1NV2  NV2", 1), "dgx1")
    assert topo.link("GPU0", "GPU2").code == "NV1" and topo.link("GPU0", "GPU3").code == "NV2"
    assert any("cell 'NV1NV2' split into NV1 NV2 (a tab was lost)" in n for n in topo.notes)
    assert parse_topo_text(text).link("GPU0", "GPU1").code == "NV4"  # spaces instead of tabs: fine too


def test_tabs_lost_to_single_spaces_recovered_with_note():
    text = "\n".join(" ".join(line.split()) for line in B300.splitlines())
    topo = parse_topo_text(text, "b300")
    reference = parse_topo_text(B300, "b300")
    assert topo.gpus == reference.gpus and topo.links() == reference.links()
    assert any("8 GPU row(s) not aligned to 8-column tab stops" in n for n in topo.notes)
    assert any("lost its empty corner cell" in n for n in topo.notes)


def test_single_spaces_with_an_empty_cpu_field_are_refused():
    # Without tab stops an empty CPU field cannot be told from a missing NUMA value: refuse, don't guess.
    text = "GPU0 GPU1 CPU Affinity NUMA Affinity GPU NUMA ID\nGPU0 X NV4 0 N/A\nGPU1 NV4 X 0 N/A\n"
    with pytest.raises(TopoplanError) as info:
        parse_topo_text(text, "t")
    assert info.value.line == 2
    assert info.value.message == ("row GPU0: expected values for CPU Affinity, NUMA Affinity, GPU NUMA ID after the "
                                  "link cells, found '0 N/A'")


def test_empty_cpu_field_kept_by_tabs_and_by_tab_stops():
    text = PAIR.replace("GPU0\t X \tNV4\t0-7\t0", "GPU0\t X \tNV4\t\t0")
    for variant in (text, text.expandtabs(8), "\n".join("    " + l for l in text.expandtabs(8).splitlines())):
        gpu = parse_topo_text(variant).gpu(0)
        assert (gpu.cpus, gpu.numa_node, gpu.gpu_numa_id) == (None, 0, None)


def test_blank_lines_between_rows_recovered_with_note():
    text = T4.replace("\nGPU1", "\n\nGPU1")
    topo = parse_topo_text(text, "t4")
    assert topo.link("GPU1", "GPU2").code == "NODE"
    assert topo.notes == ("line 3: blank line between matrix rows ignored",)


def test_windows_line_ends_and_utf16(tmp_path):
    path = _write(tmp_path, T4.replace("\n", "\r\n").encode("utf-16"))
    topo = read_topology(path)
    assert topo.gpu(1).cpus == tuple(range(16, 32)) + tuple(range(48, 64)) and topo.notes == ()


def test_stdin(monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(T4.encode())))
    assert len(read_topology("-").gpus) == 4
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    with pytest.raises(TopoplanError) as info:
        read_topology("-")
    assert str(info.value) == "<stdin>:1: the file is empty; expected the text output of `nvidia-smi topo -m`"


def test_wrapped_rows_joined_with_note():
    # A narrow terminal or an editor broke the long B300 rows after the NIC cells.
    lines = []
    for line in B300.splitlines():
        if line.startswith("GPU"):
            cells = line.split("\t")
            lines += ["\t".join(cells[:15]), "\t".join(cells[15:])]
        else:
            lines.append(line)
    topo = parse_topo_text("\n".join(lines), "b300")
    reference = parse_topo_text(B300, "b300")
    assert topo.gpus == reference.gpus and topo.links() == reference.links()
    assert "line 2: row GPU0 was wrapped over lines 2-3; joined, its cells read in order" in topo.notes
    assert len([n for n in topo.notes if "was wrapped" in n]) == 8


def test_real_escape_codes_like_a_terminal():
    text = B300.replace("[4m", "\x1b[4m").replace("[0m", "\x1b[0m")
    assert "\x1b[4mGPU0" in text
    topo = parse_topo_text(text)
    assert topo.notes == () and topo.gpus == parse_topo_text(B300).gpus


def test_mp_output_after_a_prompt_line():
    # `topo -mp` prints the same matrix with PCIe paths only (no NV#); prose and prompts before it are skipped.
    text = ("Topology of node a12 (PCIe only):\n"
            "user@a12:~$ nvidia-smi topo -mp\n"
            "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tPXB\tPIX\t0-31\t0\t\tN/A\n"
            "GPU1\tPXB\t X \tPXB\t0-31\t0\t\tN/A\n"
            "NIC0\tPIX\tPXB\t X \t\t\t\t\n")
    topo = parse_topo_text(text, "mp.txt")
    assert [(l.a, l.b, l.code) for l in topo.links()] == [
        ("GPU0", "GPU1", "PXB"), ("GPU0", "NIC0", "PIX"), ("GPU1", "NIC0", "PXB")]
    # read as is, with the one note that NVLink, if any, is not in this view (plan warns with it)
    assert topo.nics[0].name is None and topo.notes == (NVLINK_HIDDEN,)
