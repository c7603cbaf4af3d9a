"""PCI-tree distances and NIC discovery from a /sys tree made in a temporary folder."""

import pytest
from fake_sysfs import build_sysfs

from topoplan.topology.sysfs_nics import pci_link_code, read_sysfs, sysfs_address


def place(*path, numa=0):
    return {"path": list(path), "numa_node": numa}


SWITCH = ("pci0000:15", "0000:15:01.0", "0000:16:00.0")  # root complex, root port, switch upstream port


@pytest.mark.parametrize(("a", "b", "code"), [
    (place(*SWITCH, "0000:17:00.0", "0000:18:00.0"), place(*SWITCH, "0000:17:01.0", "0000:19:00.0"), "PIX"),
    # one device one switch further down: two bridges between it and the shared switch
    (place(*SWITCH, "0000:17:00.0", "0000:1a:00.0", "0000:1b:00.0", "0000:1c:00.0"),
     place(*SWITCH, "0000:17:01.0", "0000:19:00.0"), "PXB"),
    (place("pci0000:15", "0000:15:01.0", "0000:16:00.0"), place("pci0000:15", "0000:15:02.0", "0000:17:00.0"), "PHB"),
    (place("pci0000:15", "0000:15:01.0", "0000:16:00.0"), place("pci0000:30", "0000:30:01.0", "0000:31:00.0"), "NODE"),
    (place("pci0000:15", "0000:16:00.0"), place("pci0000:95", "0000:96:00.0", numa=1), "SYS"),
    (place("pci0000:15", "0000:16:00.0"), place("pci0000:95", "0000:96:00.0", numa=None), None),
    (None, place("pci0000:95", "0000:96:00.0"), None),
])
def test_pci_link_code(a, b, code):
    assert pci_link_code(a, b) == code
    assert pci_link_code(b, a) == code


def test_sysfs_address():
    assert sysfs_address("00000000:1B:00.0") == "0000:1b:00.0"
    assert sysfs_address("00000009:01:00.0") == "0009:01:00.0"


def test_nics_from_infiniband_then_net_without_repeats(tmp_path):
    sysfs = {
        "nics": [{"name": "mlx5_10", "class": "infiniband", "pci_address": "0000:18:00.1"},
                 {"name": "mlx5_2", "class": "infiniband", "pci_address": "0000:18:00.0"}],
        "pci": {"0000:18:00.0": place("pci0000:16", "0000:16:01.0", "0000:18:00.0"),
                "0000:18:00.1": place("pci0000:16", "0000:16:01.0", "0000:18:00.1"),
                "0000:c1:00.0": place("pci0000:c0", "0000:c0:01.0", "0000:c1:00.0", numa=None),
                "0000:1b:00.0": place("pci0000:16", "0000:16:02.0", "0000:1b:00.0")},
    }
    root = build_sysfs(tmp_path, sysfs, extra_links={
        "class/net/ib0": "0000:18:00.0",  # the IPoIB interface of mlx5_2: already listed
        "class/net/eno1": "0000:c1:00.0",  # a plain Ethernet port
        "class/net/lo": "",  # virtual: no device link
    })
    found = read_sysfs(["00000000:1B:00.0"], root)
    assert found["nics"] == [
        {"name": "mlx5_2", "class": "infiniband", "pci_address": "0000:18:00.0"},  # natural order: 2 before 10
        {"name": "mlx5_10", "class": "infiniband", "pci_address": "0000:18:00.1"},
        {"name": "eno1", "class": "net", "pci_address": "0000:c1:00.0"},
    ]
    assert found["pci"]["0000:c1:00.0"] == {"path": ["pci0000:c0", "0000:c0:01.0", "0000:c1:00.0"], "numa_node": None}
    assert found["pci"]["0000:1b:00.0"]["path"][-1] == "0000:1b:00.0"


def test_no_sysfs_at_all(tmp_path):
    assert read_sysfs(["00000000:1B:00.0"], tmp_path) == {"nics": [], "pci": {}}
