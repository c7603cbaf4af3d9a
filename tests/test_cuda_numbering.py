"""CUDA's numbering of GPUs against NVML's, and CUDA_VISIBLE_DEVICES, on hand-made GPU lists."""

from topoplan.topology.cuda_numbering import GpuIdentity, default_order, pci_bus_order, visible_gpus

H100 = "NVIDIA H100 80GB HBM3"


def gpus(*specs):
    return [GpuIdentity(bus, uuid, name) for bus, uuid, name in specs]


# listed in NVML order, deliberately not bus order, across two PCI domains
BOX = gpus(("00000000:C3:00.0", "GPU-aaaa-1", H100), ("00000000:1B:00.0", "GPU-bbbb-2", H100),
           ("00000001:05:00.0", "GPU-cccc-3", H100), ("00000000:43:00.0", "GPU-dddd-4", H100))


def test_pci_bus_order_sorts_domain_then_bus():
    assert pci_bus_order(BOX) == [2, 0, 3, 1]


def test_default_order_is_bus_order_only_for_identical_gpus():
    assert default_order(BOX) == [2, 0, 3, 1]
    mixed = gpus(("00000000:1B:00.0", "GPU-1", H100), ("00000000:43:00.0", "GPU-2", "NVIDIA L4"))
    assert default_order(mixed) is None
    unnamed = gpus(("00000000:1B:00.0", "GPU-1", H100), (None, None, None))
    assert default_order(unnamed) is None


def test_unset_means_all_visible_and_unknown():
    assert visible_gpus(None, [0, 1, 2, 3], BOX) == ([None] * 4, [])


def test_indexes_count_in_the_chosen_order():
    visible, notes = visible_gpus("0,1", pci_bus_order(BOX), BOX)
    assert visible == [False, True, False, True] and notes == []  # CUDA 0, 1 = buses 1B, 43


def test_uuid_and_unique_prefix():
    assert visible_gpus("GPU-cccc-3", [0, 1, 2, 3], BOX)[0] == [False, False, True, False]
    assert visible_gpus("dddd", [0, 1, 2, 3], BOX)[0] == [False, False, False, True]


def test_the_first_bad_entry_ends_the_list():
    visible, notes = visible_gpus("3,7,0", [0, 1, 2, 3], BOX)
    assert visible == [False, False, False, True]
    assert notes == ["CUDA_VISIBLE_DEVICES entry '7' names no GPU here; CUDA ignores it and every entry after it"]
    assert visible_gpus("-1", [0, 1, 2, 3], BOX)[0] == [False] * 4
    assert visible_gpus("MIG-1234", [0, 1, 2, 3], BOX)[1][0].startswith("CUDA_VISIBLE_DEVICES entry 'MIG-1234'")


def test_empty_hides_every_gpu():
    assert visible_gpus("", [0, 1, 2, 3], BOX) == ([False] * 4, [])


def test_indexes_in_an_unpredictable_default_order_are_not_guessed():
    visible, notes = visible_gpus("0", None, BOX)
    assert visible == [None] * 4 and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in notes[0]
