"""Bad options of `run`, `bench`, `calibrate` and `validate` are refused in the parent, before any rank starts:
one `topoplan: error:` line on stderr, exit 2, no traceback, nothing written. In-process and fast: spawning
ranks is replaced by a function that fails the test if it is ever reached."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import topoplan.bench.launch
import topoplan.runner.local
from topoplan import cli
from topoplan.bench import calibrate as calibrate_module
from topoplan.bench.machine_limits import physical_memory_bytes
from topoplan.bench.request import BenchRequest
from topoplan.bench.validate import check_sizes, model_spec
from topoplan.limits import RANKS_PER_CPU, max_local_ranks


@pytest.fixture
def no_ranks(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started")

    monkeypatch.setattr(topoplan.runner.local, "spawn_ranks", refuse)
    monkeypatch.setattr(topoplan.bench.launch, "spawn_ranks", refuse)


def topoplan_error(monkeypatch, capsys, *args: str) -> str:
    """Run the CLI in-process; assert the one-line exit-2 contract and return the message."""
    monkeypatch.setattr(sys, "argv", ["topoplan", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith("topoplan: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_one_dtype_table_sizes_and_torch_dtypes():
    """Each row's size is its torch dtype's, both spellings find the row, each command takes its set."""
    import torch

    from topoplan.dtypes import BENCH_DTYPES, DTYPES, KV_DTYPES, PLAN_DTYPES, PROBE_DTYPES, RUN_DTYPES, dtype_of

    for d in DTYPES:
        assert torch.empty((), dtype=d.torch()).element_size() == d.bytes
        assert dtype_of(d.short) is dtype_of(d.name) is d
    assert dtype_of("bf16").torch() is torch.bfloat16 and dtype_of("fp8").torch() is torch.float8_e4m3fn
    assert PLAN_DTYPES == ("fp32", "bf16", "fp16", "fp8", "int4", "mxfp4") and PROBE_DTYPES == ("fp32", "bf16", "fp16")
    assert KV_DTYPES == ("fp32", "bf16", "fp16", "fp8")  # int4, mxfp4: weight formats (packed, with block scales)
    assert dtype_of("mxfp4").weight_bytes == 17 / 32  # 32 4-bit weights share one 8-bit scale (OCP MX)
    assert RUN_DTYPES == ("float32", "bfloat16", "float16")
    assert BENCH_DTYPES == ("float32", "bfloat16", "float16", "float8_e4m3fn")


@pytest.mark.parametrize("args, message", [
    (["--tp", "2", "--dtype", "int8"], "--dtype 'int8': expected one of float32, bfloat16, float16"),
    (["--backend", "mpi"], "--backend 'mpi': expected nccl or gloo"),
    (["--timeout", "0"], "--timeout 0: expected a positive number of seconds"),
    (["--timeout", "-1"], "--timeout -1: expected a positive"),
    (["--temperature", "-1"], "--temperature -1: expected 0 (greedy) or more"),
    (["--top-p", "0"], "--top-p 0: expected a probability mass in (0, 1]"),
    (["--top-p", "2"], "--top-p 2: expected"),
    (["--seed", "-1"], "--seed -1: expected 0 to 2**64-1"),
    (["--max-new-tokens", "10000000"], "--max-new-tokens 10000000 + a 3-token prompt exceed the model's context "
                                       "of 4096 tokens"),
    (["--max-new-tokens", "4094"], "--max-new-tokens 4094 + a 3-token prompt exceed"),
])
def test_run_refuses_bad_options_before_any_rank(no_ranks, monkeypatch, capsys, args, message):
    err = topoplan_error(monkeypatch, capsys, "run", "-m", "tiny", "--prompt", "Hi", *args)
    assert message in err


def test_run_context_counts_prompt_ids(no_ranks, monkeypatch, capsys):
    err = topoplan_error(monkeypatch, capsys, "run", "--prompt-ids", "1,2,3,4,5", "--max-new-tokens", "4092")
    assert "--max-new-tokens 4092 + a 5-token prompt exceed the model's context of 4096" in err


def test_run_save_refuses_a_file_a_missing_folder_and_run_options(no_ranks, monkeypatch, capsys, tmp_path):
    existing = tmp_path / "empty.txt"
    existing.write_text("")
    err = topoplan_error(monkeypatch, capsys, "run", "--save", str(existing))
    assert f"{existing}: exists and is not a folder" in err
    err = topoplan_error(monkeypatch, capsys, "run", "--save", str(tmp_path / "nodir" / "x"))
    assert f"{tmp_path / 'nodir'}: the folder does not exist" in err
    err = topoplan_error(monkeypatch, capsys, "run", "--save", str(tmp_path / "x"), "--tp", "2", "--ignore-eos")
    assert "--save writes --model's checkpoint and exits; it takes no --tp, --ignore-eos" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]  # nothing created


@pytest.mark.parametrize("args, message", [
    (["--backend", "mpi"], "--backend 'mpi': expected nccl or gloo"),
    (["--dtype", "int8"], "--dtype 'int8': expected one of float32, bfloat16, float16, float8_e4m3fn"),
    (["--timeout", "0"], "--timeout 0: expected a positive"),
    (["--ranks", "0"], "--ranks 0: expected at least 1"),
    (["--ranks", "100000"], f"100000 ranks: at most {max_local_ranks()} ({RANKS_PER_CPU} per usable CPU)"),
    (["--groups", "dp"], "--groups needs --layout"),
    (["--plot", "out.png"], "--plot 'out.png': the chart is SVG; expected a file name ending in .svg"),
])
def test_bench_refuses_bad_options_before_any_rank(no_ranks, monkeypatch, capsys, args, message):
    assert message in topoplan_error(monkeypatch, capsys, "bench", *args)


def test_output_directories_are_refused_up_front(no_ranks, monkeypatch, capsys, tmp_path):
    folder = tmp_path / "adir.svg"
    folder.mkdir()
    assert f"{folder}: is a directory; expected a file name" in topoplan_error(monkeypatch, capsys, "bench",
                                                                               "--plot", str(folder))

    def no_measuring(**kwargs):
        raise AssertionError("calibrate measured before checking --out")

    monkeypatch.setattr(calibrate_module, "calibrate", no_measuring)
    assert f"{tmp_path}: is a directory" in topoplan_error(monkeypatch, capsys, "calibrate", "--out", str(tmp_path))


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root may write anywhere")
def test_unwritable_folder_is_refused_up_front(no_ranks, monkeypatch, capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    err = topoplan_error(monkeypatch, capsys, "bench", "--plot", str(locked / "x.svg"))
    assert f"{locked}: the folder is not writable" in err


def test_bench_request_argv_and_default_group():
    request = BenchRequest.from_options(ops="all_reduce", sizes="4K:16K", layout="tp=2,dp=2", backend="gloo",
                                       iters=3, warmup=1, timeout=9.0)
    assert request.world() == 4 and request.sizes == (4096, 8192, 16384)
    argv = request.worker_argv()
    assert argv == ["--ops", "all_reduce", "--sizes", "4K,8K,16K", "--iters", "3", "--warmup", "1", "--dtype",
                    "float32", "--timeout", "9.0", "--backend", "gloo", "--layout", "tp=2,pp=1,dp=2", "--redop", "sum",
                    "--root", "0"]
    assert request.group == "tp"  # the default group of a layout
    assert BenchRequest.from_worker_argv(argv) == request  # the ranks read back what the parent checked
    assert BenchRequest.from_worker_argv([]) == BenchRequest()  # one set of defaults for the CLI and the worker
    assert BenchRequest().sizes[0] == 4096 and BenchRequest().sizes[-1] == 64 << 20


@pytest.mark.parametrize("args, message", [
    (["--probe-mib", "100000000"], "--probe-mib 100000000: the probes hold 3x it"),
    (["--topo", "missing.txt"], "missing.txt"),
])
def test_calibrate_refuses_before_measuring(no_ranks, monkeypatch, capsys, tmp_path, args, message):
    monkeypatch.setattr(calibrate_module, "probe_all", lambda *a: pytest.fail("measured"))
    err = topoplan_error(monkeypatch, capsys, "calibrate", "--out", str(tmp_path / "c.json"), *args)
    assert message in err and not (tmp_path / "c.json").exists()


def test_calibrate_refuses_topo_on_a_cpu_machine(no_ranks, monkeypatch, capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this check is for CPU machines")
    topo = next((Path(__file__).parents[1] / "fixtures" / "topo").glob("*dgx*a100*.txt"))
    monkeypatch.setattr(calibrate_module, "probe_all", lambda *a: pytest.fail("measured"))
    err = topoplan_error(monkeypatch, capsys, "calibrate", "--out", str(tmp_path / "c.json"), "--topo", str(topo))
    assert f"--topo {topo}: names GPU link classes, but torch sees no GPU here" in err


def test_validate_sizes_are_bounded_before_prompts_are_built():
    from topoplan.errors import TopoplanError

    spec = model_spec("tiny")
    check_sizes(spec, batch=2, prompt_len=32, gen_len=32)  # the defaults fit
    with pytest.raises(TopoplanError, match=r"--prompt-len 100000000 \+ --gen-len 32 exceed the model's context "
                                             r"of 4096 tokens"):
        check_sizes(spec, batch=2, prompt_len=100_000_000, gen_len=32)
    with pytest.raises(TopoplanError, match=r"--prompt-len 32 \+ --gen-len 5000 exceed"):
        check_sizes(spec, batch=2, prompt_len=32, gen_len=5000)
    huge_batch = physical_memory_bytes() // (64 * spec.kv_bytes_per_token("fp32")) + 1
    with pytest.raises(TopoplanError, match=rf"--batch {huge_batch} x 64 tokens need a .* KV cache, more than half"):
        check_sizes(spec, batch=huge_batch, prompt_len=32, gen_len=32)


@pytest.mark.parametrize("args, message", [
    (["bench", "--iters", "100001"], "--iters 100001: expected 1 to 100,000"),
    (["bench", "--iters", "10" * 30], "--iters 1010101010"),  # no overflow, no traceback: the same line
    (["bench", "--warmup", "100001"], "--warmup 100001: expected 0 to 100,000"),
    (["calibrate", "--iters", "1000000"], "--iters 1000000: expected 1 to 100,000"),
    (["calibrate", "--warmup", "1000000"], "--warmup 1000000: expected 0 to 100,000"),
    (["validate", "--repeats", "101"], "--repeats 101: expected 1 to 100"),
    (["validate", "--repeats", "0"], "--repeats 0: expected 1 to 100"),
    (["validate", "--engine", "vllm", "--repeats", "101"], "--repeats 101: expected 1 to 100"),
    (["validate", "--batch", "2000000"], "--batch 2000000: expected 1 to 1,048,576"),
    (["validate", "--gen-len", "20000000"], "--gen-len 20000000: expected 1 to 16,777,216"),
    (["validate", "--prompt-len", "20000000"], "--prompt-len 20000000: expected 1 to 16,777,216"),
    (["run", "--prompt", "Hi", "--max-new-tokens", "20000000"], "--max-new-tokens 20000000: expected 1 to "
                                                               "16,777,216"),
    (["run", "--prompt", "Hi", "--max-new-tokens", "0"], "--max-new-tokens 0: expected 1 to 16,777,216"),
    (["run", "--prompt", "Hi", "--micro-batches", "5000"], "--micro-batches 5000: expected 0 to 4,096"),
    (["plan", "-m", "tiny", "--batch", "2000000"], "--batch 2000000: expected 1 to 1,048,576"),
    (["plan", "-m", "tiny", "--gen-len", "20000000"], "--gen-len 20000000: expected 1 to 16,777,216"),
])
def test_every_count_option_has_an_upper_bound(no_ranks, monkeypatch, capsys, tmp_path, args, message):
    """A slip of a few zeros is refused in one line before anything is measured or started (topoplan.limits'
    COUNT_OPTIONS, docs/limits.md); calibrate's --out is a fresh file that must stay unwritten."""
    if args[0] == "calibrate":
        args = [*args, "--out", str(tmp_path / "cal.json")]
    assert message in topoplan_error(monkeypatch, capsys, *args)
    assert not (tmp_path / "cal.json").exists()


def test_count_bounds_are_documented():
    """Every row of COUNT_OPTIONS appears in docs/limits.md with its bounds."""
    from topoplan.limits import COUNT_OPTIONS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "limits.md").read_text()
    for option, (least, most) in COUNT_OPTIONS.items():
        assert f"`{option}` | {least:,} to {most:,}" in doc, option


def test_kv_cache_gib_and_a_too_long_model_name_are_one_line(tmp_path):
    """`launch --kv-cache-gib` has an upper bound; `run --model` with a name too long for the file system is one
    line (it was a traceback from Path.is_dir)."""
    import subprocess
    import sys

    for args, words in ((["launch", "--engine", "vllm", "--device", "cpu", "--layout", "tp=1", "--checkpoint", "/m",
                          "--kv-cache-gib", "99999999"], "--kv-cache-gib 99999999: expected 1 to 65,536"),
                        (["run", "--model", "x" * 300, "--prompt-ids", "1"], "File name too long")):
        done = subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**__import__("os").environ,
                                                 "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr
