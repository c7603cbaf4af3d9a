"""SVG and PNG pictures drawn without Graphviz: the layout (scene.py) on every fixture, the SVG read back with
xml.etree, the PNG decoded by hand (signature, chunks, CRCs, zlib, pixels)."""

from __future__ import annotations

import math
import struct
import xml.etree.ElementTree as ET
import zlib
from itertools import combinations
from pathlib import Path

import pytest
from test_topology_render import _two_sockets

from topoplan.machine import load_topology
from topoplan.topology.render.picture import picture
from topoplan.topology.render.png import SCALE, render_png, rgb
from topoplan.topology.render.scene import BACKGROUND, FILL, Box, label_box, scene
from topoplan.topology.render.svg import render_svg

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p for p in (ROOT / "fixtures/topo").glob("*.txt")
                  if not p.name.endswith((".p2p.txt", ".measured.txt")))
SVG = "{http://www.w3.org/2000/svg}"


def _overlap(a: Box, b: Box) -> bool:
    return a.x < b.x + b.w and b.x < a.x + a.w and a.y < b.y + b.h and b.y < a.y + a.h


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name[:2])
def test_layout_of_every_fixture_keeps_boxes_apart_and_inside(path: Path):
    topo = load_topology(str(path), None, "file", None, None)
    laid = scene(topo)
    assert sorted(b.id for b in laid.nodes if b.kind == "gpu") == sorted(g.id for g in topo.gpus)
    assert sorted(b.id for b in laid.nodes if b.kind == "nic") == sorted(n.id for n in topo.nics)
    for a, b in combinations(laid.nodes, 2):
        assert not _overlap(a, b), (a.id, b.id)
    for box in (*laid.nodes, *laid.frames):
        assert 0 <= box.x and box.x + box.w <= laid.width and 0 <= box.y and box.y + box.h <= laid.height, box.id
    groups = picture(topo).groups
    assert [f.id for f in laid.frames] == [f"numa{n}" for n in groups if n is not None]
    for frame in laid.frames:  # a NUMA frame holds the devices of its node and no other
        assert {b.id for b in laid.nodes if _overlap(frame, b)} == set(groups[int(frame.id[4:])]), frame.id
    for edge in laid.edges:  # arcs stay on the picture
        assert all(0 <= edge.at(t / 10)[1] <= laid.height for t in range(11)), (edge.a, edge.b)
    labels = [label_box(e) for e in laid.edges if e.labelled]
    for (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) in combinations(labels, 2):  # drawn labels never collide
        assert not (ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1)
    if any(e.a.startswith("GPU") and e.b.startswith("GPU") for e in laid.edges):
        assert labels  # some GPU-GPU arc says its code and bandwidth on the picture


def test_svg_has_one_node_per_device_labels_and_typed_edges():
    root = ET.fromstring(render_svg(scene(_two_sockets())))
    assert root.tag == f"{SVG}svg"
    nodes = {g.get("id"): g for g in root.iter(f"{SVG}g") if g.get("class", "").startswith("node ")}
    assert {i: g.get("class") for i, g in nodes.items()} == {
        "GPU0": "node gpu", "GPU1": "node gpu", "GPU2": "node gpu", "GPU3": "node gpu", "NIC0": "node nic",
        "NIC1": "node nic"}
    assert [t.text for t in nodes["NIC1"].iter(f"{SVG}text")] == ["NIC1", 'eth"0', "SYS to every GPU"]
    assert [t.text for t in nodes["NIC0"].iter(f"{SVG}text")] == ["NIC0", "mlx5_0", "PIX 24 GB/s to GPUs"]
    assert nodes["GPU0"].find(f"{SVG}rect") is not None and nodes["NIC0"].find(f"{SVG}ellipse") is not None
    edges = [(p.get("data-a"), p.get("data-b"), p.get("class"), p.get("data-code"), p.find(f"{SVG}title").text,
              p.get("stroke-dasharray")) for p in root.iter(f"{SVG}path")]
    assert sorted(edges) == [
        ("GPU0", "GPU1", "edge nvlink", "NV4", "NV4 80 GB/s", None),
        ("GPU0", "NIC0", "edge pix", "PIX", "PIX 24 GB/s", "6,4"),
        ("GPU1", "NIC0", "edge pix", "PIX", "PIX 24 GB/s", "6,4"),
        ("GPU2", "GPU3", "edge nvlink", "NV4", "NV4 80 GB/s", None),
    ]
    frames = {g.get("id"): [t.text for t in g.iter(f"{SVG}text")] for g in root.iter(f"{SVG}g")
              if g.get("class") == "numa"}
    assert frames == {"numa0": ["NUMA node 0", "CPUs 0-15"], "numa1": ["NUMA node 1", "CPUs 16-31"]}
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "legend"] == ["NVLink", "PIX"]


def test_svg_of_an_nvswitch_box_draws_the_hub():
    topo = load_topology(str(next(p for p in FIXTURES if p.name.startswith("00_"))), None, "file", None, None)
    root = ET.fromstring(render_svg(scene(topo)))
    hub = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "node hub")
    assert [t.text for t in hub.iter(f"{SVG}text")] == ["NVLink all-to-all", "NV12 240 GB/s per pair"]
    to_hub = sorted(p.get("data-a") for p in root.iter(f"{SVG}path") if p.get("data-b") == hub.get("id"))
    assert to_hub == [f"GPU{i}" for i in range(8)]


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB PNG without filtering; every CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(tag + body), tag
        chunks.append((tag, body))
        pos += 12 + length
    assert [t for t, _ in chunks][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, interlace) == (8, 2, 0)
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    stride = 1 + 3 * width
    assert len(raw) == height * stride
    assert all(raw[y * stride] == 0 for y in range(height))  # filter type None on every row
    return width, height, [raw[y * stride + 1:(y + 1) * stride] for y in range(height)]


def test_png_decodes_to_the_scene_size_with_boxes_and_links_painted():
    laid = scene(_two_sockets())
    width, height, rows = decode_png(render_png(laid))
    assert (width, height) == (math.ceil(laid.width * SCALE), math.ceil(laid.height * SCALE))

    def pixel(x: float, y: float) -> bytes:
        px, py = int(x * SCALE), int(y * SCALE)
        return rows[py][3 * px:3 * px + 3]

    assert pixel(1, 1) == rgb(BACKGROUND)
    gpu0 = next(b for b in laid.nodes if b.id == "GPU0")
    assert pixel(gpu0.x + 3, gpu0.y + 3) == rgb(FILL["gpu"])  # inside the box, clear of its text
    nic0 = next(b for b in laid.nodes if b.id == "NIC0")
    assert pixel(nic0.cx, nic0.y + 3) == rgb(FILL["nic"])
    nvlink = next(e for e in laid.edges if e.code == "NV4")
    assert pixel(*nvlink.at(0.2)) == rgb(nvlink.color)
    assert b"\x00\x00\x00" in b"".join(rows)  # text is drawn
