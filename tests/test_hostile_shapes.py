"""Issue 37's classes of hostile input, one new input of each shape: every one ends in one `topoplan: error:` line
and exit 2 (or, where the shape is valid input, in the right answer), within 10 s and 256 MiB of Python
allocations, with nothing from the input reaching the terminal raw."""

from __future__ import annotations

import json
import os
import re
import stat
import tracemalloc
from pathlib import Path

import pytest
from fuzz_cases import Outcome, broken, run_within_budget
from grammar_cases import P2P, P2P_TOPO
from hostile_inputs import DGX, HUGE, LLAMA

from topoplan.atomic import write_atomic
from topoplan.cpuset import parse_cpu_list
from topoplan.errors import TopoplanError
from topoplan.limits import (
    MAX_DEPTH,
    MAX_ELEMENTS,
    MAX_GPUS_PER_NODE,
    MAX_LAYERS,
    MAX_LINES,
    MAX_NICS_PER_NODE,
    MAX_TEXT_COLUMNS,
    read_capped,
)

ROCM = DGX.parents[1] / "amd" / "rocm-smi-mi50-4gpu-pcie-1numa.txt"
XML = DGX.parents[1] / "nccl" / "ibm-cloud-h100-8gpu-nvswitch-8nic-dump.xml"
RECORDING = DGX.parents[1] / "nvml" / "hgx-h100-8gpu-nvswitch.json"
LAUNCH = ["launch", "--layout", "tp=8", "--topo", str(DGX), "--gpu", "a100-80gb"]


def within_budget(*argv: str) -> Outcome:
    outcome = run_within_budget(list(argv))
    assert not broken(outcome), (broken(outcome), outcome.err[-500:], outcome.traceback)
    return outcome


def refused(*argv: str) -> str:
    """The one error line (without its prefix) of a run that must exit 2."""
    outcome = within_budget(*argv)
    assert outcome.code == 2, outcome.out[-300:]
    return outcome.err.removeprefix("topoplan: error: ").rstrip("\n")


def inspect_file(tmp_path: Path, text: str, name: str = "topo") -> str:
    path = tmp_path / name
    path.write_text(text)
    return refused("inspect", "--file", str(path))


def _busid(i: int) -> str:
    return f"{i // 256:04x}:{i % 256:02x}:00.0"


# --- NCCL topology XML -------------------------------------------------------------------------------------
def test_xml_nested_pci_is_refused_at_the_depth_limit_not_by_recursion(tmp_path):
    depth = 5_000
    bridges = "".join(f'<pci busid="{_busid(k)}" class="0x060400">\n' for k in range(depth))
    text = f'<system version="1"><cpu numaid="0">\n{bridges}{"</pci>" * depth}</cpu></system>'
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:{MAX_DEPTH}: <pci> nested {MAX_DEPTH + 1} levels "
                                            "deep; expected an NCCL topology XML (NCCL_TOPO_DUMP_FILE output or an "
                                            f"NCCL_TOPO_FILE), which nests fewer than {MAX_DEPTH}")


@pytest.mark.parametrize("numaid,expected", [
    ("0x" + "f" * 5_000, "<cpu> numaid: a number with 5000 digits; expected at most 20"),
    ("0x400", "<cpu numaid='0x400'>: NUMA node 1024; Linux numbers them 0 to 1023"),
    ("0x" + "f" * 16, "NUMA node 18446744073709551615; Linux numbers them 0 to 1023"),
], ids=["5000-hex-digits", "node-1024", "uint64-max"])
def test_xml_hex_attributes_are_bounded(tmp_path, numaid, expected):
    err = inspect_file(tmp_path, XML.read_text().replace('numaid="0"', f'numaid="{numaid}"', 1))
    assert err.startswith(f"{tmp_path}/topo:") and expected in err


@pytest.mark.parametrize("what,element", [
    ("GPUs", '<pci busid="{}" class="0x030200"/>'),
    ("NICs", '<pci busid="{}" class="0x020000"/>'),
])
def test_xml_thousands_of_devices_stop_at_the_node_caps(tmp_path, what, element):
    many = "".join(element.format(_busid(i)) + "\n" for i in range(5_000))
    text = f'<system version="1"><cpu numaid="0">\n<pci busid="ffff:00:00.0" class="0x030200"/>\n{many}</cpu></system>'
    cap = MAX_GPUS_PER_NODE if what == "GPUs" else MAX_NICS_PER_NODE
    line = 2 + cap + (0 if what == "GPUs" else 1)  # the first device beyond the cap
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:{line}: more than {MAX_GPUS_PER_NODE} GPUs or "
                                            f"{MAX_NICS_PER_NODE} NICs in one file, more than one machine holds "
                                            "(docs/limits.md); expected an NCCL topology XML (NCCL_TOPO_DUMP_FILE "
                                            "output or an NCCL_TOPO_FILE)")


def test_xml_line_numbers_stay_linear_and_right_at_the_end_of_a_large_file(tmp_path):
    filler = "<x/>\n" * (MAX_ELEMENTS - 10)  # elements the reader ignores, each on its own line
    text = f'<system version="1"><cpu numaid="0">\n{filler}<gpu dev="0"/>\n</cpu></system>'
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:{MAX_ELEMENTS - 8}: <gpu> outside a <pci> element; "
                                            "expected <pci busid=...><gpu .../></pci>")


def test_xml_with_more_elements_than_the_limit(tmp_path):
    text = '<system version="1"><cpu numaid="0">' + "<x/>" * (4 * MAX_ELEMENTS) + "</cpu></system>"
    assert f"more than {MAX_ELEMENTS:,} elements" in inspect_file(tmp_path, text)


def test_numa_nodes_beyond_linux_never_reach_a_numactl_line(tmp_path):
    err = inspect_file(tmp_path, DGX.read_text().replace("48-63,176-191\t3", "48-63,176-191\t1024", 1))
    assert err == f"{tmp_path}/topo:2: row GPU0, NUMA Affinity: expected a NUMA node number or N/A, found '1024'"
    data = json.loads(RECORDING.read_text())
    next(iter(data["sysfs"]["pci"].values()))["numa_node"] = 5_000
    assert "expected -1..1023, found 5000" in inspect_file(tmp_path, json.dumps(data))


# --- AMD text ----------------------------------------------------------------------------------------------
def test_amd_numbers_beyond_the_digit_limit(tmp_path):
    err = inspect_file(tmp_path, ROCM.read_text().replace("Numa Node: 0", f"Numa Node: {HUGE}", 1))
    assert err == f"{tmp_path}/topo:24: Numa Nodes block, node: a number with 5000 digits; expected at most 20"
    weights = re.sub(r"\b40\b", "4" * 30, ROCM.read_text())  # symmetric, so only the digits are wrong
    assert inspect_file(tmp_path, weights).endswith("'weight' table, row GPU0: a number with 30 digits; expected "
                                                    "at most 20")


def test_amd_table_with_more_gpus_than_a_node(tmp_path):
    n = MAX_GPUS_PER_NODE + 1
    rows = "\n".join(f"GPU{i} " + " ".join("0" if i == j else "PCIE" for j in range(n)) for i in range(n))
    text = ("=== ROCm System Management Interface ===\n=== Link Type between two GPUs ===\n"
            + " ".join(f"GPU{i}" for i in range(n)) + "\n" + rows + "\n")
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:3: 'link type' table: {n} GPUs in the header, more "
                                            f"than one machine holds ({MAX_GPUS_PER_NODE}, docs/limits.md)")


# --- every text reader: blank-line floods and repeated CPU ranges -----------------------------------------
FLOOD = 10_000_000


def test_smi_blank_flood_costs_no_object_per_line_and_keeps_line_numbers(tmp_path):
    lines = DGX.read_text().split("\n")
    text = "\n".join([lines[0], *[""] * FLOOD, lines[1], "GPU1\tjunk"])
    assert inspect_file(tmp_path, text).startswith(f"{tmp_path}/topo:{FLOOD + 3}: ")


def test_p2p_blank_flood(tmp_path):
    lines = P2P.read_text().split("\n")
    p2p = tmp_path / "p2p"
    p2p.write_text("\n".join([*["  "] * FLOOD, *lines[:2], "GPU1 junk"]))
    err = refused("inspect", "--file", str(P2P_TOPO), "--p2p", str(p2p))
    assert err.startswith(f"{p2p}:{FLOOD + 3}: ")
    p2p.write_text("\n".join([*lines[:2], *[""] * FLOOD, *lines[2:]]))  # a flood inside the matrix: its first line
    assert refused("inspect", "--file", str(P2P_TOPO), "--p2p", str(p2p)) == (
        f"{p2p}:3: expected P2P row GPU1, found a blank line; the matrix looks truncated")


def test_amd_blank_flood(tmp_path):
    text = ROCM.read_text().replace("\n\n", "\n" * FLOOD, 1).replace("PCIE", "BOGUS", 1)
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:{19 + FLOOD - 2}: 'link type' table is not symmetric: "
                                            "GPU1-GPU0 is 'PCIE' here but 'BOGUS' in row GPU0")


def test_a_paste_of_more_non_blank_lines_than_any_tool_prints(tmp_path):
    assert inspect_file(tmp_path, "x\n" * (MAX_LINES + 1)) == (f"{tmp_path}/topo:{MAX_LINES + 1}: more than "
                                                               f"{MAX_LINES:,} lines of text; no topology output is "
                                                               "this long")


def test_a_p2p_matrix_of_more_gpus_than_a_node(tmp_path):
    n = MAX_GPUS_PER_NODE + 1
    p2p = tmp_path / "p2p"
    p2p.write_text("\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\n" + "\n".join(
        f"GPU{i}\t" + "\t".join("X" if i == j else "OK" for j in range(n)) for i in range(n)) + "\n")
    assert refused("inspect", "--file", str(P2P_TOPO), "--p2p", str(p2p)) == (
        f"{p2p}:1: P2P header: {n} GPUs, more than one machine holds ({MAX_GPUS_PER_NODE}, docs/limits.md)")


def test_tabs_that_would_expand_a_paste_beyond_the_column_limit(tmp_path):
    text = DGX.read_text().replace("\tNV12", "\t" * 3_000_000 + "NV12", 1)  # 3 MB that would expand to 24 MB
    assert inspect_file(tmp_path, text) == (f"{tmp_path}/topo:2: more than {MAX_TEXT_COLUMNS >> 20} Mi characters of "
                                            "text once its tabs are expanded; no topology output is this wide")


def test_repeated_cpu_ranges_are_merged_not_expanded_one_by_one(tmp_path):
    assert parse_cpu_list(",".join(["0-65535"] * 60_000)) == tuple(range(65_536))
    assert parse_cpu_list("8-15,0-3,2-9,3") == tuple(range(16))
    cell = ",".join(["0-65535"] * 200_000) + ",0-99999"  # 2.8 MB in one cell, damaged at its very end
    err = inspect_file(tmp_path, DGX.read_text().replace("48-63,176-191", cell, 1))
    assert err.startswith(f"{tmp_path}/topo:2: row GPU0, CPU Affinity: expected a CPU list")


# --- JSON recordings and calibration files ---------------------------------------------------------------
def test_a_recording_shaped_to_cost_time_and_memory(tmp_path):
    data = json.loads(RECORDING.read_text())
    data["nvml"]["gpus"][0]["nvlinks"] *= 5_000  # 90,000 links: 20 MB, under the byte cap
    assert len(json.dumps(data)) < 32 * 2**20
    assert inspect_file(tmp_path, json.dumps(data)).endswith(f"JSON values; expected at most {MAX_ELEMENTS:,} in a "
                                                            "topoplan recording")


def test_a_calibration_shaped_to_cost_time_and_memory(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text('{"version": 1, "x": [' + ",".join(["{}"] * 3_000_000) + "]}")
    err = refused("plan", "--model", "70b", "--topo", str(DGX), "--gpu", "a100-80gb", "--calibration", str(cal))
    assert err == f"{cal}: 6000002 JSON values; expected at most {MAX_ELEMENTS:,} in a topoplan calibration file"


def test_an_unclosed_string_of_escaped_quotes_stays_linear(tmp_path):
    assert "not valid JSON (Unterminated string" in inspect_file(tmp_path, '{"a": "' + '\\"' * 8_000_000)


# --- names from input, printed -----------------------------------------------------------------------------
NAME = "A100 [/] [bold red]x\x1b]0;pwned\x07\x1b[2J"


def test_device_names_reach_the_tables_as_text(tmp_path):
    data = json.loads(RECORDING.read_text())
    data["nvml"]["gpus"][0]["name"] = NAME
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(data))
    outcome = within_budget("inspect", "--file", str(path))
    assert outcome.code == 0
    assert "A100 [/] [bold red]x\\x1b]0;pwned\\x07\\x1b[2J" in outcome.out  # printed as written, escapes visible


def test_a_model_folder_named_in_markup_reaches_the_plan_title_as_text(tmp_path):
    model = tmp_path / "a[" / "]b[bold]"  # the path holds `[/]`, a closing tag with nothing to close
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(LLAMA))
    outcome = within_budget("plan", "--model", str(model), "--topo", str(DGX), "--gpu", "a100-80gb", "--prompt-len",
                            "64", "--gen-len", "64")
    assert outcome.code == 0 and "]b[bold] (bf16) on 1 x 8 a100-sxm4-80gb" in outcome.out  # the title, folded


def test_a_name_with_an_escape_in_an_error_line(tmp_path):
    path = tmp_path / "x\x1b]0;pwned\x07\ny"
    path.write_text("")
    assert refused("inspect", "--file", str(path)) == (f"{tmp_path}/x\\x1b]0;pwned\\x07\\ny:1: the file is empty; "
                                                       "expected the text output of `nvidia-smi topo -m`")


def test_an_engine_script_comment_stays_one_line_whatever_the_checkpoint_holds(tmp_path):
    script = tmp_path / "serve.sh"
    within_budget(*LAUNCH, "--engine", "vllm", "--checkpoint", "/m\nrm -rf ~\r#", "-o", str(script))
    lines = script.read_bytes().decode().split("\n")  # as the shell splits it: a \r ends no line
    assert lines[1].startswith("# topoplan launch: vllm serving /m\\nrm -rf ~\\r# with tp=8")
    assert "rm -rf ~" not in [line.strip() for line in lines]  # in the command, the path stays one quoted word


# --- HF configs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change,expected", [
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8},
     "num_experts_per_tok 8 is more than the 4 experts; expected each token routed to at most every expert"),
    ({"num_hidden_layers": 10**9},
     f"num_hidden_layers 1000000000: more than {MAX_LAYERS:,}, beyond any real model (docs/limits.md)"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}},
     "key 'rope_scaling.factor' must be a positive finite number, got 0"),
    ({"eos_token_id": [1, 256]}, "eos_token_id 256 is beyond the vocabulary (vocab_size 256: ids 0 to 255)"),
], ids=["top-k-over-experts", "1e9-layers", "rope-factor-0", "eos-beyond-vocab"])
def test_hf_config_contradictions(tmp_path, change, expected):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **change}))
    err = refused("plan", "--model", str(tmp_path), "--topo", str(DGX), "--gpu", "a100-80gb")
    assert err == f"{tmp_path}/config.json: {expected}"


# --- paths -------------------------------------------------------------------------------------------------
def test_reading_a_file_allocates_what_it_holds_not_the_cap(tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    tracemalloc.start()
    assert read_capped(small) == b"x" * 1000
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**10, peak  # was the 32 MiB cap for every file
    status = Path("/proc/self/status")  # a procfs file says 0 bytes: read on to its end all the same
    assert status.stat().st_size == 0 and read_capped(status).startswith(b"Name:")


def test_a_fifo_given_as_input_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refused("inspect", "--file", str(fifo)) == (f"{fifo}: a FIFO (named pipe), not a regular file; expected "
                                                       "a topology, recording, config or calibration file (pipe "
                                                       "input through stdin, `-`)")


def test_output_at_a_symlink_loop_or_an_over_long_name(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert refused(*LAUNCH, "-o", str(tmp_path / "a")) == (f"{tmp_path}/a: more than 40 symbolic links to follow "
                                                           "(a loop?); expected a file to write")
    long = tmp_path / ("n" * 300)
    assert refused(*LAUNCH, "-o", str(long)) == f"{long}: cannot write to it: File name too long"


def test_an_over_long_model_path(tmp_path):
    long = tmp_path / ("m" * 300)
    assert refused("plan", "--model", str(long), "--topo", str(DGX), "--gpu", "a100-80gb") == (
        f"{long}: cannot read it: File name too long; expected a model name or a HF checkpoint folder")


def test_an_error_about_a_path_with_a_newline_stays_one_line(tmp_path):
    assert refused("inspect", "--file", f"{tmp_path}/no\nsuch") == (f"{tmp_path}/no\\nsuch: cannot read it: No such "
                                                                   "file or directory")


def test_output_never_widens_the_mode_of_the_file_it_replaces(tmp_path):
    script = tmp_path / "launch.sh"
    script.write_text("private\n")
    script.chmod(0o600)
    within_budget(*LAUNCH, "-o", str(script))
    assert stat.S_IMODE(script.stat().st_mode) == 0o600 and script.read_text().startswith("#!")


@pytest.mark.skipif(os.geteuid() != 0, reason="planting a symlink owned by another user needs root (chown)")
def test_output_refuses_a_symlink_planted_by_another_user_in_a_sticky_folder(tmp_path):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    secret = tmp_path / "secret"
    secret.write_text("keep\n")
    secret.chmod(0o600)
    link = shared / "launch.sh"
    link.symlink_to(secret)
    os.lchown(link, 12345, 12345)
    assert refused(*LAUNCH, "-o", str(link)) == (f"{link}: a symbolic link owned by another user (uid 12345) in a "
                                                 "shared sticky folder; not followed (the kernel's protected_symlinks "
                                                 "rule): remove it or write elsewhere")
    assert secret.read_text() == "keep\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    os.lchown(link, os.geteuid(), os.getegid())  # our own link there is followed, as the kernel does
    write_atomic(link, "new\n")
    assert secret.read_text() == "new\n" and link.is_symlink()


def test_write_atomic_refuses_a_loop_in_one_line(tmp_path):
    (tmp_path / "self").symlink_to(tmp_path / "self")
    with pytest.raises(TopoplanError, match="more than 40 symbolic links"):
        write_atomic(tmp_path / "self", "x")
