"""The GPU catalog: lookups by NVML name, sanity of the data, and family inference from link patterns."""

import itertools

import pytest

from topoplan.architectures import ARCHITECTURES
from topoplan.errors import TopoplanError
from topoplan.hardware import GPUS, find_gpu, infer_gpu_family, lookup_gpu
from topoplan.topology import Gpu, build_topology


@pytest.mark.parametrize(("nvml_name", "key"), [
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("A100-SXM4-40GB", "a100-sxm4-40gb"),  # drivers before ~460 left out the "NVIDIA " prefix
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell"),
    ("nvidia rtx 6000 ada generation", "rtx-6000-ada"),
])
def test_nvml_names_resolve(nvml_name, key):
    assert find_gpu(nvml_name).key == key


def test_unknown_name_lists_close_ones():
    assert lookup_gpu("Tesla K80") is None
    with pytest.raises(TopoplanError, match="unknown GPU 'h10'.*close: .*h100"):
        find_gpu("h10")


def test_every_entry_is_complete_and_names_are_unique():
    every_name = [n for spec in GPUS for n in {spec.key, *spec.aliases, *spec.nvml_names}]
    assert len(every_name) == len(set(every_name))
    for spec in GPUS:
        assert spec.arch in ARCHITECTURES and ARCHITECTURES[spec.arch].dtypes is not None, spec.key
        assert spec.source and spec.nvml_names
        if spec.vendor == "amd":  # XGMI links have no NVLink generation; FP8 came with CDNA3 (gfx942)
            assert spec.nvlink_gen == 0 and spec.arch.startswith("gfx"), spec.key
            assert (spec.fp8_tflops is None) == (spec.arch in ("gfx90a", "gfx1100")), spec.key
            continue
        assert (spec.nvlink_links == 0) == (spec.nvlink_gen == 0), spec.key
        # FP8 tensor cores came with Ada and Hopper: none before sm89, all from sm89 on
        assert (spec.fp8_tflops is None) == (int(spec.arch[2:]) < 89), spec.key
        if spec.fp8_tflops:
            # L40S datasheet: 733 vs 2 x 362.05
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02), spec.key


def test_issue_list_is_covered():
    for wanted in ["v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb", "a100-sxm4-40gb",
                   "a100-sxm4-80gb", "a100-pcie-40gb", "a100-pcie-80gb", "a10", "a30", "a40", "l4", "l40s",
                   "h100-sxm", "h100-pcie", "h100-nvl", "h20", "h200", "b200", "gh200", "rtx-3090", "rtx-4090",
                   "rtx-5090", "rtx-6000-ada", "rtx-pro-6000-blackwell"]:
        assert lookup_gpu(wanted) is not None, wanted


def _topology(n: int, nvlinks: dict[tuple[int, int], int]):
    gpus = [Gpu(f"GPU{i}", i) for i in range(n)]
    codes = {(f"GPU{a}", f"GPU{b}"): (f"NV{nvlinks[a, b]}" if (a, b) in nvlinks else "SYS")
             for a, b in itertools.combinations(range(n), 2)}
    return build_topology(gpus, [], codes)


def _all_pairs(n, count):
    return {pair: count for pair in itertools.combinations(range(n), 2)}


@pytest.mark.parametrize(("n", "nvlinks", "arch", "words"), [
    (8, _all_pairs(8, 12), "sm80", "A100 SXM4"),  # DGX A100 (fixtures 00, 04, 26)
    (8, _all_pairs(8, 18), "sm90", "H100/H200"),  # HGX H100/H200
    (4, _all_pairs(4, 4), "sm80", "HGX A100 4-GPU"),  # fixture 30
    (2, {(0, 1): 18}, "sm90", "H100/H200"),  # two GPUs of an HGX board
    (4, _all_pairs(4, 12), "sm80", "A100 SXM4"),  # half a DGX A100
    (2, {(0, 1): 4}, "sm86", "RTX 3090"),  # fixture 14
    (4, {(0, 1): 4, (2, 3): 4}, "sm86", "RTX 3090"),
    (8, {(0, 1): 12, (2, 3): 12, (4, 5): 12, (6, 7): 12}, "sm80", "A100 PCIe"),  # fixtures 17, 18
    (4, {(0, 1): 2, (2, 3): 2}, "sm60", "P100"),  # fixture 20
    # fixture 07, the DGX-1 hybrid cube-mesh, as printed
    (8, {(0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
         (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2}, "sm70", "DGX-1"),
])
def test_family_inferred_from_link_pattern(n, nvlinks, arch, words):
    inferred = infer_gpu_family(_topology(n, nvlinks))
    assert inferred is not None
    assert inferred[0] == arch
    assert words in inferred[1] and "inferred" in inferred[1] and "--gpu" in inferred[1]


@pytest.mark.parametrize(("n", "nvlinks"), [
    (4, {}),  # PCIe only: an L40S box and a T4 box look alike
    (8, _all_pairs(8, 7)),  # a pattern no known board shows
    (3, {(0, 1): 12, (1, 2): 12}),  # a chain: not pairs, not a full mesh
])
def test_no_family_when_the_pattern_says_nothing(n, nvlinks):
    assert infer_gpu_family(_topology(n, nvlinks)) is None
