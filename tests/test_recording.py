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
    assert detect_format('{"gpus": []}') == "JSON"


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
    with pytest.raises(TopoplanError, match=r"^machine.json: damaged recording \(KeyError: 'index'\)$"):
        topology_from_recording(data, "machine.json")


def test_save_is_all_or_nothing(tmp_path):
    target = tmp_path / "out.json"
    save_recording({"a": 1}, target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    with pytest.raises(TopoplanError, match="cannot write"):
        save_recording({"a": 1}, tmp_path / "missing-dir" / "out.json")
