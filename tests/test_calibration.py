"""Calibration file: the schema's defaults, overrides, round trip, and one-line errors naming the key."""

import json

import pytest

from topoplan.errors import TopoplanError
from topoplan.plan.calibration import Calibration, load_calibration, parse_calibration, to_json


def write(tmp_path, data):
    path = tmp_path / "calibration.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_defaults_without_a_file():
    assert load_calibration(None) == Calibration()


def test_overrides_and_round_trip(tmp_path):
    path = write(tmp_path, {"version": 1, "links": {"nvlink": {"alpha_us": 1.5, "bandwidth_gbps": 180},
                                                    "net": {"bandwidth_gbps": 23}},
                            "memory_bandwidth_efficiency": 0.85, "layer_overhead_us": 12, "runtime_reserve": 0.2})
    cal = load_calibration(path)
    assert cal.link("nvlink").alpha_us == 1.5 and cal.link("nvlink").bandwidth_gbps == 180
    assert cal.link("net").bandwidth_gbps == 23 and cal.link("net").alpha_us == Calibration().link("net").alpha_us
    assert (cal.memory_bandwidth_efficiency, cal.layer_overhead_us, cal.runtime_reserve) == (0.85, 12, 0.2)
    assert cal.flop_efficiency == Calibration().flop_efficiency
    again = parse_calibration(to_json(cal), path)
    assert again == cal


@pytest.mark.parametrize("data, message", [
    ({"flop_efficiency": 1.5}, "flop_efficiency: expected a fraction in (0, 1], got 1.5"),
    ({"links": {"nvlnk": {"alpha_us": 1}}}, "links.nvlnk: unknown link class"),
    ({"links": {"pix": {"alpha_us": -1}}}, "links.pix.alpha_us: expected a non-negative number, got -1"),
    ({"links": {"pix": {"bandwidth_gbps": 0}}}, "links.pix.bandwidth_gbps: must be above 0"),
    ({"colective_base_us": 3}, "unknown key(s) colective_base_us"),
    ({"version": 2}, "version 2: this topoplan reads version 1"),
    ([], "expected a JSON object"),
])
def test_bad_files_name_the_key(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(TopoplanError) as error:
        load_calibration(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_invalid_json_names_the_line(tmp_path):
    path = write(tmp_path, '{\n"flop_efficiency": 0.5,\n}')
    with pytest.raises(TopoplanError, match=r"calibration.json:3: not valid JSON"):
        load_calibration(path)
