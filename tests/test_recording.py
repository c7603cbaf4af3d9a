"""Recording files: telling them from `topo -m` text, and one clear error for each kind of damage."""

import json
from pathlib import Path

import pytest

from topoplan.errors import TopoplanError
from topoplan.topology.read import detect_format
from topoplan.topology.recording import parse_recording, save_recording, topology_from_recording

GH200 = Path(__file__).parent.parent / "fixtures" / "nvml" / "gh200-grace-1gpu.json"
TOPO = Path(__file__).parent.parent / "fixtures" / "topo" / "22_l40s-8gpu-node-sys-1nic-nolegend.txt"


def test_recording_or_topo_text():
    assert detect_format(GH200.read_text()) == "recording"
    assert detect_format(TOPO.read_text()) == "smi-text"
    assert detect_format('\n  {"format": "topoplan-nvml-recording", "truncated') == "recording"  # gets the JSON error
    assert detect_format('{"gpus": []}') == "other JSON"


@pytest.mark.parametrize(("text", "message", "line"), [
    ('{\n "format": "topoplan-nvml-recording",\n "schema_version": 1,,\n}', "not valid JSON", 3),
    ('{"format": "something-else"}', 'expected "format": "topoplan-nvml-recording"', None),
    ('[1, 2]', 'expected "format"', None),
    ('{"format": "topoplan-nvml-recording", "schema_version": 7}', "recording schema version 7; this topoplan "
                                                                    "reads version 1", None),
    ('{"format": "topoplan-nvml-recording", "schema_version": 1, "nvml": {}, "environment": {}}',
     "recording has no 'sysfs' object", None),
])
def test_bad_recordings_are_one_clear_error(text, message, line):
    with pytest.raises(TopoplanError) as caught:
        parse_recording(text, "machine.json")
    assert message in caught.value.message
    assert (caught.value.source, caught.value.line) == ("machine.json", line)


def test_damage_inside_is_named_not_a_traceback():
    data = json.loads(GH200.read_text())
    del data["nvml"]["gpus"][0]["index"]
    with pytest.raises(TopoplanError, match=r"^machine.json: damaged recording \(ValueError: nvml.gpus\[0\]: "
                                            r"no 'index'\)$"):
        topology_from_recording(data, "machine.json")
    data = json.loads(GH200.read_text())
    data["nvml"]["gpus"][0]["memory_total"] = "96 GB"
    with pytest.raises(TopoplanError, match=r"nvml.gpus\[0\].memory_total: expected int, found '96 GB'"):
        topology_from_recording(data, "machine.json")


def test_an_nvml_error_answer_in_a_sysfs_field_is_damage():
    """NVML answers some fields with {"nvml_error": ...}; sysfs never does, so such an answer where a NIC's name
    belongs is damage, named, not a dict that reaches the NIC table (it raised AttributeError)."""
    data = json.loads((GH200.parent / "gb200-nvl72-tray-4gpu.json").read_text())
    data["sysfs"]["nics"][0]["name"] = {"nvml_error": "GPU_IS_LOST"}
    with pytest.raises(TopoplanError, match=r"sysfs.nics\[0\].name: expected str, found \{'nvml_error'"):
        topology_from_recording(data, "machine.json")


def test_save_is_all_or_nothing(tmp_path):
    target = tmp_path / "out.json"
    save_recording({"a": 1}, target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with pytest.raises(TopoplanError, match="cannot write"):
        save_recording({"a": 1}, tmp_path / "missing-dir" / "out.json")


# --- fuzz: a recording damaged anywhere gives a graph or one TopoplanError, never a traceback -------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from topoplan.topology.diagnose import diagnose  # noqa: E402
from topoplan.topology.export import topology_dict  # noqa: E402

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "nvml").glob("*.json"))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 70), st.text(max_size=6),
                 st.lists(st.integers(-1, 2**64), max_size=3), st.builds(dict),
                 st.builds(lambda: {"nvml_error": "GPU_IS_LOST"}),
                 st.just("00000000:1B:00.0"))


def _leaves(node, path=()):
    """Every (path, value) in a JSON tree, containers included."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _leaves(child, (*path, key))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fixture=st.sampled_from(FIXTURES), picks=st.lists(st.tuples(st.integers(0, 10**6), JUNK), min_size=1,
                                                            max_size=3))
def test_damaged_recordings_never_traceback(fixture, picks):
    data = json.loads(fixture.read_text())
    for pick, junk in picks:
        spots = [p for p, _ in _leaves(data) if p]
        *parent, key = spots[pick % len(spots)]
        node = data
        for step in parent:
            node = node[step]
        node[key] = junk
    try:
        topo = topology_from_recording(data, "fuzz.json")
    except TopoplanError:
        return
    json.dumps(topology_dict(topo, diagnose(topo)))
