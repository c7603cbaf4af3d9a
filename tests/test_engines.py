"""Engine profiles (topoplan/engines): resolution by NAME@VERSION, one-line errors, every constant sourced,
and the rules each profile encodes (memory policy, all-reduce kernel choice) worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoplan.engines import DEFAULT_ENGINE, ENGINE_NAMES, ENGINES, default_engine, resolve, versions
from topoplan.engines.engine import AllReducePath, MemoryPolicy, constants, version_tuple
from topoplan.errors import TopoplanError


@pytest.mark.parametrize("text, expected", [
    ("vllm", "vllm@0.32"), ("vllm@0.2", "vllm@0.2"), ("vllm@0.2.4", "vllm@0.2"), ("VLLM@0.12.0", "vllm@0.32"),
    ("vllm@0.32.1", "vllm@0.32"), ("sglang", "sglang@0.5"), ("sglang@0.4.6.post1", "sglang@0.5"),
    ("trtllm", "trtllm@1.0"), ("trtllm@1.3.0rc20", "trtllm@1.0"), ("topoplan", "topoplan@0.1"),
])
def test_resolve_picks_the_profile_covering_the_version(text, expected):
    assert str(resolve(text)) == expected


def test_resolve_keeps_an_engine_and_the_default_is_a_known_engine():
    old = resolve("vllm@0.2")
    assert old.cuda_graphs_decode is False and resolve(old) is old
    assert DEFAULT_ENGINE in ENGINE_NAMES and resolve(DEFAULT_ENGINE) is default_engine()
    assert not default_engine().serves and all(e.serves for e in ENGINES if e.name != DEFAULT_ENGINE)


def test_one_registry_lists_every_engine_once():
    """The registry is the only list: names come from it, each (name, version) once, newest last per name."""
    assert ENGINE_NAMES == ("topoplan", "vllm", "sglang", "trtllm")
    assert len({str(e) for e in ENGINES}) == len(ENGINES)
    assert [str(e) for e in versions("vllm")] == ["vllm@0.2", "vllm@0.32"]
    assert {e.launcher for e in ENGINES} == {None, "vllm", "sglang", "trtllm"}


@pytest.mark.parametrize("text, words", [
    ("vllm@0.5", ["no vllm profile for version '0.5'", "vllm@0.2 covers 0.2.0-0.2.4", "vllm@0.32 covers 0.8.0-0.32"]),
    ("vllm@0.2.5", ["no vllm profile for version '0.2.5'"]),  # past the eager 0.2 line the profile describes
    ("trtllm@0.9", ["no trtllm profile", "trtllm@1.0 covers 1.0.0-1.3"]),
    ("vllm@latest", ["no vllm profile for version 'latest'"]),
    ("tgi", ["unknown engine 'tgi'"]),
])
def test_unknown_versions_are_one_line_errors(text, words):
    with pytest.raises(TopoplanError) as err:
        resolve(text)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_every_engine_has_a_profile_and_every_constant_a_source():
    assert {e.name for e in ENGINES} == set(ENGINE_NAMES)
    for name in ENGINE_NAMES:
        for profile in versions(name):
            numbers = constants(profile)
            assert "overheads.step_overhead_us" in numbers and "memory.fraction" in numbers
            assert set(numbers) == set(profile.sources), profile  # none missing, none stale
            assert all(len(text) > 10 for text in profile.sources.values())


def test_version_tuples():
    assert version_tuple("0.2") == (0, 2) and version_tuple("1.3.0rc20") == (1, 3, 0)
    assert version_tuple("0.5.6.post2") == (0, 5, 6) and version_tuple("latest") is None


def test_memory_policies_by_hand():
    gb = 1e9
    vllm = resolve("vllm").memory  # 0.9 of 80 GB, less the 3.76 GB reserve
    assert vllm.usable_bytes(80 * gb, 35 * gb, 4) == pytest.approx(0.9 * 80 * gb - 3.76 * gb)
    trt = resolve("trtllm").memory  # weights + 0.9 of what is free after weights and the reserve
    assert trt.usable_bytes(80 * gb, 35 * gb, 4) == pytest.approx(35 * gb + 0.9 * (80 - 35 - 3.76) * gb)
    sgl = resolve("sglang").memory  # mem_fraction_static by TP size
    assert [sgl.fraction_for(tp) for tp in (1, 2, 4, 8, 16)] == [0.88, 0.87, 0.85, 0.81, 0.79]
    assert vllm.kv_tokens(2049) == 2064 and sgl.kv_tokens(2049) == 2049 and trt.kv_tokens(2049) == 2080


def test_allreduce_kernel_choice_follows_vllm_rule():
    """csrc/custom_all_reduce.cuh: world 2 one-shot always; < 512 KiB at <= 4 GPUs, < 256 KiB at <= 8; 8 MiB cap;
    only on a full NVLink mesh of 2/4/6/8 GPUs."""
    ar = resolve("vllm").allreduce
    kib = 1024
    assert ar.kernel(2, 4096 * kib, True) == "one-shot"
    assert ar.kernel(4, 511 * kib, True) == "one-shot" and ar.kernel(4, 512 * kib, True) == "two-shot"
    assert ar.kernel(8, 255 * kib, True) == "one-shot" and ar.kernel(8, 256 * kib, True) == "two-shot"
    assert ar.kernel(8, 9 * 1024 * kib, True) == "nccl"  # above max_size
    assert ar.kernel(8, 16 * kib, False) == "nccl"  # no full NVLink mesh
    assert ar.kernel(3, 16 * kib, True) == "nccl"  # world size it does not support
    assert resolve("vllm@0.2").allreduce.kernel(8, 16 * kib, True) == "nccl"  # custom all-reduce came in 0.3.0
    assert AllReducePath(custom=False).kernel(2, 1, True) == "nccl"


def test_memory_policy_free_basis_never_goes_below_the_weights():
    policy = MemoryPolicy(basis="free", fraction=0.9, option="x", kv_block_tokens=1, reserved_gb=4)
    assert policy.usable_bytes(10e9, 9e9, 1) == 9e9  # nothing free after weights and reserve: no KV pool


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_any_engine_text_resolves_or_is_one_line_error(text):
    try:
        profile = resolve(text)
    except TopoplanError as err:
        assert "\n" not in str(err) and str(err)
    else:
        assert profile.name in ENGINE_NAMES and (profile.matches(text.partition("@")[2]) or "@" not in text.strip())
