"""Hostile inputs by grammar (issue 37), shared by tests/test_fuzz_grammar.py (a bounded sample in CI) and
benchmarks/fuzz_sweep.py --grammar: hypothesis strategies, one per input format, that write structurally valid
files at extreme shapes -- deep nesting, huge counts, long numbers, markup and control characters in every name
field, repeated CPU ranges, blank-line floods, inconsistent MoE fields -- where random damage (fuzz_cases.py)
rarely lands. Each strategy draws a `Case` whose kind names its format and shape (`nccl-xml/deep`), so a sweep
can count outcomes per class.

The contract is the one of docs/limits.md, checked by `run_within_budget` (hostile_inputs.py): exit 0, or exit 2
with one `topoplan: error:` line; within 10 s and 256 MiB; and nothing from the input reaching the terminal raw
(no ESC or BEL byte in what is printed)."""

from __future__ import annotations

import json

from fuzz_cases import Case
from hostile_inputs import DGX, LLAMA, RECORDINGS
from hypothesis import strategies as st

# Names a device, model or file may be given: rich markup, terminal escapes (OSC retitle, clear screen), BEL,
# a newline, a bidi override, plain text. XML and JSON carry the control characters as character references.
HOSTILE_NAMES = ["[/]", "[bold red]x[/bold red]", "\x1b]0;pwned\x07", "\x1b[2J", "a\nb", "\u202ename", "[link=x]y",
                 "mlx5_0", "\\[", "]"]
P2P = DGX.with_name("14_rtx3090-2gpu-nv4-lxc-cpuset.p2p.txt")
P2P_TOPO = DGX.with_name("14_rtx3090-2gpu-nv4-lxc-cpuset.txt")
LEGEND = "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n  NV#  = Connection traversing NVLinks\n"
TOPO_COMMAND = ["inspect", "--file", "{dir}/topo", "--json"]
TABLE_COMMAND = ["inspect", "--file", "{dir}/topo"]  # the rich tables, where markup in a name would act
huge_count = st.sampled_from([0, 1, 33, 129, 1_000, 100_001, 1_000_000])
long_digits = st.integers(19, 6_000).map(lambda n: "9" * n)
flood = st.integers(1, 5_000_000)  # blank lines


def _commands(draw: st.DrawFn) -> list[str]:
    return draw(st.sampled_from([TOPO_COMMAND, TABLE_COMMAND]))


# --- nvidia-smi topo -m and topo -p2p text -------------------------------------------------------------------
def _matrix(n: int, nics: list[str], affinity: str, numa: str) -> str:
    """A `topo -m` paste of n NVLink GPUs and the named NICs."""
    devices = [f"GPU{i}" for i in range(n)] + [f"NIC{k}" for k in range(len(nics))]
    rows = ["\t" + "\t".join([*devices, "CPU Affinity", "NUMA Affinity"])]
    for i, device in enumerate(devices):
        cells = [" X " if i == j else ("NV12" if i < n and j < n else "SYS") for j in range(len(devices))]
        rows.append("\t".join([device, *cells, *([affinity, numa] if i < n else [])]))
    legend = "\n\nNIC Legend:\n\n" + "\n".join(f"  NIC{k}: {name}" for k, name in enumerate(nics))
    return "\n".join(rows) + LEGEND + (legend if nics else "") + "\n"


@st.composite
def smi_text(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["gpus", "names", "flood", "ranges", "digits", "wide", "lines"]))
    n, nics, affinity, numa = 2, ["mlx5_0"], "0-15", "0"
    if shape == "gpus":
        n = draw(st.integers(1, 200))
    elif shape == "names":
        nics = draw(st.lists(st.sampled_from(HOSTILE_NAMES).filter(lambda s: "\n" not in s), min_size=1, max_size=4))
    elif shape == "ranges":
        part = draw(st.sampled_from(["0-65535", "0-15", "7", "0-0", "65535"]))
        affinity = ",".join([part] * draw(st.integers(1, 400_000)))
    elif shape == "digits":
        numa = draw(long_digits)
    text = _matrix(n, nics, affinity, numa)
    if shape == "wide":  # tabs, each of which becomes up to 8 columns
        text = text.replace("\tNV12", "\t" * draw(st.sampled_from([2, 10_000, 3_000_000, 30_000_000])) + "NV12", 1)
    elif shape == "lines":
        text += "x\n" * draw(st.sampled_from([1, 19_000, 20_001, 5_000_000]))
    elif shape == "flood":
        lines = text.split("\n")
        at = draw(st.integers(0, len(lines)))
        text = "\n".join(lines[:at] + [draw(st.sampled_from(["", "  ", "\t"]))] * draw(flood) + lines[at:])
    return Case(f"smi-text/{shape}", _commands(draw), {"topo": text})


@st.composite
def p2p_text(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["flood", "gpus"]))
    text = P2P.read_text()
    if shape == "flood":
        lines = text.split("\n")
        at = draw(st.integers(0, len(lines)))
        text = "\n".join(lines[:at] + [""] * draw(flood) + lines[at:])
    else:
        n = draw(st.sampled_from([3, 32, 33, 500, 3_000]))
        text = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + "\n" + "\n".join(
            f"GPU{i}\t" + "\t".join("X" if i == j else "OK" for j in range(n)) for i in range(n)) + "\n"
    return Case(f"p2p/{shape}", ["inspect", "--file", str(P2P_TOPO), "--p2p", "{dir}/p2p", "--json"], {"p2p": text})


# --- NCCL topology XML -----------------------------------------------------------------------------------------
def _xml_attr(text: str) -> str:
    """`text` as an XML attribute value, control characters as character references (expat gives them back)."""
    return "".join(f"&#{ord(c)};" if ord(c) < 32 or c in "<&\"" else c for c in text)


def _busid(i: int) -> str:
    return f"{i // 256:04x}:{i % 256:02x}:00.0"


@st.composite
def nccl_xml(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["deep", "gpus", "nics", "hex", "names", "elements"]))
    gpus = [f'<pci busid="{_busid(i)}" class="0x030200"><gpu dev="{i}" sm="80" rank="{i}" gdr="1"/></pci>'
            for i in range(2)]
    numaid, nets = "0", ['<nic><net name="mlx5_0" dev="0" speed="100000"/></nic>']
    if shape == "deep":
        depth = draw(st.integers(1, 20_000))
        gpus[0] = "".join(f'<pci busid="{_busid(1000 + k)}" class="0x060400">' for k in range(depth)) + \
            gpus[0] + "</pci>" * depth
    elif shape == "gpus":
        count = draw(st.integers(1, 5_000))
        gpus = [f'<pci busid="{_busid(i)}" class="0x030200"/>' for i in range(count)]
    elif shape == "nics":
        nets = [f'<pci busid="{_busid(60_000 + k)}" class="0x020000"/>' for k in range(draw(st.integers(1, 5_000)))]
    elif shape == "hex":
        numaid = draw(st.sampled_from(["0x", "0x-", "-0x", ""])) + draw(st.sampled_from(["f", "9", "1"])) * draw(
            st.integers(1, 6_000))
    elif shape == "names":
        nets = [f'<nic><net name="{_xml_attr(draw(st.sampled_from(HOSTILE_NAMES)))}" dev="{k}"/></nic>'
                for k in range(draw(st.integers(1, 4)))]
    else:
        gpus.append("<x/>\n" * draw(st.sampled_from([10, 50_000, 99_990, 100_001, 400_000])))
    text = f'<system version="1"><cpu numaid="{numaid}">{"".join(gpus)}{"".join(nets)}</cpu></system>\n'
    return Case(f"nccl-xml/{shape}", _commands(draw), {"topo": text})


# --- rocm-smi / amd-smi text ----------------------------------------------------------------------------------
@st.composite
def amd_text(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["gpus", "digits", "flood", "numa"]))
    n = draw(st.integers(1, 300)) if shape == "gpus" else 2
    weight = draw(long_digits) if shape == "digits" else "40"
    node = draw(long_digits) if shape == "numa" else "0"

    def table(title: str, cell: str) -> str:
        header = "       " + "  ".join(f"GPU{i}" for i in range(n))
        rows = [f"GPU{i}   " + "  ".join("0" if i == j else cell for j in range(n)) for i in range(n)]
        return f"{'=' * 10} {title} {'=' * 10}\n{header}\n" + "\n".join(rows) + "\n\n"

    text = ("=" * 10 + " ROCm System Management Interface " + "=" * 10 + "\n" + table("Weight between two GPUs", weight)
            + table("Link Type between two GPUs", "PCIE") + "=" * 10 + " Numa Nodes " + "=" * 10 + "\n"
            + "".join(f"GPU[{i}]          : (Topology) Numa Node: {node}\n" for i in range(n)))
    if shape == "flood":
        text = text.replace("\n\n", "\n" * draw(flood), 1)
    return Case(f"amd-text/{shape}", _commands(draw), {"topo": text})


# --- NVML recordings -------------------------------------------------------------------------------------------
@st.composite
def nvml_json(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["names", "elements", "deep", "digits"]))
    data = json.loads(draw(st.sampled_from(RECORDINGS)).read_text())
    gpu = data["nvml"]["gpus"][0]
    if shape == "names":
        gpu["name"] = draw(st.sampled_from(HOSTILE_NAMES))
        for nic in data["sysfs"]["nics"][:1]:
            nic["name"] = draw(st.sampled_from(HOSTILE_NAMES))
    elif shape == "elements":
        gpu["nvlinks"] = (gpu.get("nvlinks") or [{"state": 0}]) * draw(st.sampled_from([1, 1_000, 30_000, 200_000]))
    elif shape == "deep":
        depth = draw(st.integers(1, 100_000))
        return Case("nvml-json/deep", _commands(draw), {"topo": json.dumps(data)[:-1] + ', "x": '
                                                        + "[" * depth + "]" * depth + "}"})
    else:
        return Case("nvml-json/digits", _commands(draw), {"topo": json.dumps(data).replace(
            '"index": 0', '"index": ' + draw(long_digits), 1)})
    return Case(f"nvml-json/{shape}", _commands(draw), {"topo": json.dumps(data)})


# --- HF config.json --------------------------------------------------------------------------------------------
PLAN_CONFIG = ["plan", "--model", "{dir}/model", "--topo", str(DGX), "--gpu", "a100-80gb", "--prompt-len", "64",
               "--gen-len", "64"]


@st.composite
def hf_config(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["moe", "layers", "rope", "eos", "digits", "names", "deep"]))
    config: dict = {**LLAMA}
    if shape == "moe":
        config |= {"model_type": draw(st.sampled_from(["mixtral", "qwen2_moe", "deepseek_v3"])),
                   draw(st.sampled_from(["num_local_experts", "num_experts", "n_routed_experts"])):
                       draw(st.integers(0, 300)),
                   "num_experts_per_tok": draw(st.integers(0, 600)), "moe_intermediate_size": 64,
                   "n_shared_experts": draw(st.integers(0, 4)), "first_k_dense_replace": draw(st.integers(0, 40))}
    elif shape == "layers":
        config["num_hidden_layers"] = draw(st.sampled_from([1, 2, 1_024, 1_025, 10**9, 2**31]))
    elif shape == "rope":
        config["rope_scaling"] = {"rope_type": "linear", "factor": draw(st.sampled_from([0, -1, 0.0, 1e-300, 8.0]))}
    elif shape == "eos":
        config["eos_token_id"] = draw(st.sampled_from([255, 256, 10**6, [1, 256], [2**31]]))
    elif shape == "names":
        config["model_type"] = draw(st.sampled_from(HOSTILE_NAMES))
    elif shape == "deep":
        depth = draw(st.integers(1, 100_000))
        text = json.dumps(config)[:-1] + ', "quantization_config": ' + "[" * depth + "]" * depth + "}"
        return Case("hf-config/deep", PLAN_CONFIG, {"model/config.json": text})
    text = json.dumps(config)
    if shape == "digits":
        text = text.replace('"hidden_size": 64', '"hidden_size": ' + draw(long_digits))
    return Case(f"hf-config/{shape}", PLAN_CONFIG, {"model/config.json": text})


# --- calibration files -----------------------------------------------------------------------------------------
@st.composite
def calibration(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(["elements", "deep", "digits", "names"]))
    data: dict = {"version": 1, "links": {"nvlink": {"alpha_us": 5.0, "bandwidth_gbps": 200.0}},
                  "collective_base_us": 8.0, "layer_overhead_us": 20.0, "step_overhead_us": 100.0}
    text = json.dumps(data)
    if shape == "elements":
        text = text[:-1] + ', "x": [' + ",".join(["0"] * draw(huge_count)) + "]}"
    elif shape == "deep":
        depth = draw(st.integers(1, 100_000))
        text = text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
    elif shape == "digits":
        text = text.replace("8.0", draw(long_digits), 1)
    else:
        data["links"][draw(st.sampled_from(HOSTILE_NAMES))] = {"alpha_us": 1.0}
        text = json.dumps(data)
    return Case(f"calibration/{shape}", ["plan", "--model", "70b", "--topo", str(DGX), "--gpu", "a100-80gb",
                                         "--calibration", "{dir}/cal.json"], {"cal.json": text})


FORMATS = {"smi-text": smi_text(), "p2p": p2p_text(), "nccl-xml": nccl_xml(), "amd-text": amd_text(),
           "nvml-json": nvml_json(), "hf-config": hf_config(), "calibration": calibration()}
any_case = st.one_of(*FORMATS.values())
