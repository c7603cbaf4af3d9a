"""A busy machine: the load is read before and during calibrate/validate, noisy probes are repeated and
summarised robustly, and a busy reading is refused without --force (warned and recorded with it).
Readings are injected at the boundary (topoplan.bench.load.Sources), never taken from this machine."""

import itertools
import json
import sys

import pytest
import torch

import topoplan.bench.launch
from topoplan import cli
from topoplan.bench import calibrate as calibrate_module
from topoplan.bench import probes
from topoplan.bench import validate as validate_module
from topoplan.bench.load import BUSY_LOAD_PER_CORE, LoadMonitor, Sources
from topoplan.errors import TopoplanError


def counter(start: float, step: float):
    """A reading that grows by `step` at every call (CPU seconds, a clock)."""
    values = itertools.count()
    return lambda: start + step * next(values)


def sources(load: float, others_per_call: float) -> Sources:
    """2 cores, a clock that advances 10 s per reading, and other processes taking `others_per_call` CPU
    seconds between two readings of the machine's busy time (ours stays constant)."""
    return Sources(loadavg=lambda: (load, load, load), machine_busy_s=counter(1000.0, others_per_call),
                   own_cpu_s=lambda: 7.0, clock=counter(0.0, 10.0), cores=lambda: 2)


def test_quiet_machine_passes_and_records_the_shares():
    monitor = LoadMonitor("calibrate", sources(load=0.3, others_per_call=1.0))
    monitor.check_quiet(force=False)
    with monitor.window("the probes"):
        pass
    assert monitor.others_share == {"the probes": pytest.approx(1.0 / (10 * 2))}  # 1 s of 20 CPU seconds
    report = monitor.report()
    assert report["load_before"] == 0.3 and report["busy"] is False and report["warnings"] == []


def test_load_above_the_threshold_is_refused_without_force():
    assert BUSY_LOAD_PER_CORE * 2 < 8.6
    monitor = LoadMonitor("calibrate", sources(load=8.6, others_per_call=0.0))
    with pytest.raises(TopoplanError, match=r"busy: load average 8.60 over the last minute on 2 core\(s\).*--force"):
        monitor.check_quiet(force=False)
    forced = LoadMonitor("calibrate", sources(load=8.6, others_per_call=0.0))
    forced.check_quiet(force=True)
    assert forced.busy and "measuring anyway" in forced.warnings[0]


def test_others_taking_the_cpu_during_a_step_is_said():
    monitor = LoadMonitor("validate", sources(load=0.1, others_per_call=12.0))
    monitor.check_quiet(force=False)
    with monitor.window("run 1/3 of tp=2,pp=1,dp=1"):
        pass
    assert monitor.others_share["run 1/3 of tp=2,pp=1,dp=1"] == pytest.approx(0.6)  # 12 of 20 CPU seconds
    assert monitor.busy and "took 60% of the CPU time while run 1/3 of tp=2,pp=1,dp=1 ran" in monitor.warnings[0]


def test_our_own_ranks_do_not_count_as_others():
    own = counter(0.0, 15.0)  # our ranks take 15 CPU seconds per reading, the machine's busy time the same
    machine = counter(100.0, 15.0)
    monitor = LoadMonitor("calibrate", Sources(loadavg=lambda: (0.1,) * 3, machine_busy_s=machine, own_cpu_s=own,
                                               clock=counter(0.0, 10.0), cores=lambda: 2))
    with monitor.window("the 2-rank sweep"):
        pass
    assert monitor.others_share["the 2-rank sweep"] == 0.0 and not monitor.busy


def test_no_proc_stat_means_no_during_reading():
    monitor = LoadMonitor("calibrate", Sources(loadavg=lambda: (0.1,) * 3, machine_busy_s=lambda: None,
                                               clock=counter(0.0, 1.0), cores=lambda: 2))
    with monitor.window("x"):
        pass
    assert monitor.others_share == {} and not monitor.busy


def test_noisy_probe_is_repeated_and_summarised_by_the_median():
    steady = iter([100.0, 101.0, 99.0, 100.0, 100.0])
    noise: list[float] = []
    assert probes.robust_median(lambda: next(steady), 5, noise) == 100.0
    assert noise == [pytest.approx(0.01)]  # quartiles 99.5 and 100.5 over the median 100: steady, run once
    # a stalled machine: every other sample 20x slower -> repeated up to MAX_ROUNDS rounds, median kept
    calls = itertools.count()
    noisy = lambda: 2000.0 if next(calls) % 2 else 100.0  # noqa: E731
    noise = []
    value = probes.robust_median(noisy, 3, noise)
    assert next(calls) == 3 * probes.MAX_ROUNDS  # 9 samples taken, then it stopped
    assert value == 100.0 and noise[0] > probes.NOISY  # 5 of 9 fast: the median is the quiet figure


def test_spread_is_interquartile_over_median():
    assert probes.spread([10.0]) == 0.0
    assert probes.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.5 - 1.5) / 3.0)


def fake_probes(*_args, **_kwargs):
    return {"stream_gbps": 9.0, "gemv_gbps": 12.0, "gemm_tflops": 0.05, "matmul_tflops": {"1": 0.004, "64": 0.05},
            "layer_overhead_us": 100.0, "step_overhead_us": 300.0, "matmul_call_us": {"1": 20.0, "2": 40.0},
            "moe_layer_overhead_us": 50.0, "expert_overhead_us": 10.0, "spread": {}}


@pytest.fixture
def no_measuring(monkeypatch):
    monkeypatch.setattr(calibrate_module, "sweep_link", lambda *a, **k: [])
    monkeypatch.setattr(calibrate_module, "probe_all", fake_probes)
    monkeypatch.setattr(calibrate_module, "spawn_json", lambda *a, **k: {"wait_us": FAKE_WAITS})
    monkeypatch.setattr(calibrate_module.torch.cuda, "is_available", lambda: False)


FAKE_WAITS = {"2": 40.0, "8": 60.0, "32": 200.0}


def test_calibrate_refuses_a_busy_machine_before_measuring(monkeypatch):
    monkeypatch.setattr(calibrate_module, "sweep_link", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(calibrate_module, "probe_all", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(calibrate_module.torch.cuda, "is_available", lambda: False)
    with pytest.raises(TopoplanError, match="load average 8.60"):
        calibrate_module.calibrate(probe_mib=8, sources=sources(load=8.6, others_per_call=0.0))


def test_calibrate_disturbed_is_not_written_without_force(no_measuring):
    with pytest.raises(TopoplanError, match=r"took 75% of the CPU time while the .* ran.*not written.*--force"):
        calibrate_module.calibrate(probe_mib=8, sources=sources(load=0.1, others_per_call=15.0))
    document = calibrate_module.calibrate(probe_mib=8, force=True, sources=sources(load=0.1, others_per_call=15.0))
    load = document.measured.load
    assert load["busy"] and load["others_share"]["the probes at 1 thread(s)"] == pytest.approx(0.75)


def test_calibrate_reports_its_steps(no_measuring):
    seen = []
    calibrate_module.calibrate(probe_mib=8, sources=sources(load=0.1, others_per_call=0.0),
                               on_step=lambda label, done, total: seen.append((label, done, total)))
    cores = len(calibrate_module.cpu_cores())
    total = (len({2, cores}) + 1 if cores >= 2 else 0) + len({1, cores})  # sweeps, synchronisation, probes
    assert seen[-1] == ("done", total, total)
    assert [done for _, done, _ in seen] == list(range(total + 1))
    assert ("the synchronisation probe" in [label for label, _, _ in seen]) == (cores >= 2)


@pytest.mark.skipif(len(calibrate_module.cpu_cores()) < 2, reason="one core has no collective to wait in")
def test_calibrate_adds_the_synchronisation_wait_to_the_collective_base(no_measuring):
    """No sweep fit here, so the base is the default 25 us; the probe's median wait (60 us of 40, 60, 200) is
    added: what a collective waits inside a step is the base's "rank skew", which a back-to-back sweep lacks."""
    document = calibrate_module.calibrate(probe_mib=8, sources=sources(load=0.1, others_per_call=0.0))
    assert document.constants.collective_base_us == pytest.approx(25.0 + 60.0)
    assert document.measured.sync_wait_us == FAKE_WAITS


def test_cli_calibrate_busy_is_one_line_exit_2_and_nothing_written(no_measuring, monkeypatch, capsys, tmp_path):
    busy = sources(load=8.6, others_per_call=0.0)
    monkeypatch.setattr(calibrate_module, "Sources", lambda: busy)
    out = tmp_path / "c.json"
    monkeypatch.setattr(sys, "argv", ["topoplan", "calibrate", "--out", str(out), "--probe-mib", "8"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "pass --force" in err and not out.exists()
    monkeypatch.setattr(sys, "argv", ["topoplan", "calibrate", "--out", str(out), "--probe-mib", "8", "--force"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 0 and "topoplan: warning: this machine is busy: load average 8.60" in err
    assert json.loads(out.read_text())["measured"]["load"]["busy"] is True


def test_validate_refuses_a_busy_machine_before_any_run(monkeypatch, tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"version": 1, "cpu": {"cores": 2, "numa_nodes": 1, "memory_bytes": 8e9, "threads": {
        str(n): fake_probes() for n in (1, 2)}}}))
    monkeypatch.setattr(validate_module, "measure", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(topoplan.bench.launch, "spawn_ranks", lambda *a, **k: pytest.fail("a rank started"))
    with pytest.raises(TopoplanError, match="busy: load average 8.60.*--force"):
        validate_module.validate("tiny", "tp=1", str(path), sources=sources(load=8.6, others_per_call=0.0))


def test_progress_steps_draw_on_a_terminal_only(monkeypatch, capsys):
    """The bar calibrate and validate feed: drawn when forced as on a terminal, never with --json or piped."""
    monkeypatch.setenv("TOPOPLAN_PROGRESS", "1")
    with cli.progress_steps(quiet=False) as on_step:
        assert on_step is not None
        on_step("the 2-rank sweep", 0, 3)
        on_step("the probes at 1 thread(s)", 1, 3)
    assert "the probes at 1 thread(s)" in capsys.readouterr().err
    with cli.progress_steps(quiet=True) as on_step:  # --json
        assert on_step is None
    monkeypatch.delenv("TOPOPLAN_PROGRESS")
    with cli.progress_steps(quiet=False) as on_step:  # stderr is pytest's capture, not a terminal
        assert on_step is None
    assert capsys.readouterr().err == ""


def test_moe_overheads_split_the_moe_layers_extra_cost_into_per_layer_and_per_expert(monkeypatch):
    """The MoE probe's slopes, one per expert count (top-n of n: exactly n experts run), less the dense layer's:
    the difference per expert, the rest per layer. Slopes of 100 + 40 + 30 n us for n = 2 and 6 give 40 and 30."""
    seen = []

    def slope(device, dtype, shape, steps, layer_counts, repeats, noise):
        seen.append(shape)
        return 100.0 + 40.0 + 30.0 * shape.get("num_local_experts", 0), 999.0

    monkeypatch.setattr(probes, "_layer_slope_us", slope)
    assert probes.moe_overheads_us(torch.device("cpu"), torch.float32, 100.0) == (pytest.approx(40.0), 30.0)
    assert [(s["model_type"], s["num_local_experts"], s["num_experts_per_tok"]) for s in seen] == [
        ("mixtral", 2, 2), ("mixtral", 6, 6)]
    # a probe whose MoE layer measured cheaper than the dense one (noise) gives 0, never a negative cost
    monkeypatch.setattr(probes, "_layer_slope_us", lambda *args: (90.0, 0.0))
    assert probes.moe_overheads_us(torch.device("cpu"), torch.float32, 100.0) == (0.0, 0.0)
