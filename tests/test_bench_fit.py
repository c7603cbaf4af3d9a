"""The alpha-beta fit against synthetic sweeps with known alpha and beta, and the planner constants."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topoplan.bench.fit import CollectiveFit, fit_line, fit_sweep, link_constants

SIZES = [1024 * 4**i for i in range(8)]  # 1K .. 16M


@given(alpha=st.floats(1.0, 5000.0), gbps=st.floats(0.1, 500.0))
@settings(max_examples=50, deadline=None)
def test_exact_line_is_recovered(alpha, gbps):
    beta = 1 / (gbps * 1e3)  # us per byte
    fit = fit_line(SIZES, [alpha + beta * s for s in SIZES])
    assert fit.alpha_us == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_us_per_byte == pytest.approx(beta, rel=1e-6)
    assert fit.rel_rms < 1e-9


def test_noisy_line_within_tolerance():
    rng = random.Random(7)
    alpha, beta = 300.0, 1 / 2e3  # 300 us, 2 GB/s
    times = [(alpha + beta * s) * (1 + rng.uniform(-0.03, 0.03)) for s in SIZES for _ in range(3)]
    fit = fit_line([s for s in SIZES for _ in range(3)], times)
    assert fit.alpha_us == pytest.approx(alpha, rel=0.05)
    assert fit.beta_us_per_byte == pytest.approx(beta, rel=0.05)


def test_latency_only_and_negative_intercept_are_clamped():
    flat = fit_line([4, 8, 16], [100.0, 99.0, 98.0])  # slope would be negative
    assert flat.beta_us_per_byte == 0 and flat.alpha_us == pytest.approx(99.0, rel=0.01)
    through_origin = fit_line([1000, 2000, 4000], [0.5, 2.0, 4.1])  # intercept would be negative
    assert through_origin.alpha_us == 0 and through_origin.beta_us_per_byte > 0


def rows(op, alpha, beta):
    return [{"op": op, "size_bytes": s, "time_us": alpha + beta * s} for s in SIZES]


def test_busbw_from_all_reduce_fit():
    # 4 ranks, 10 GB/s algorithm bandwidth at large sizes -> busbw 10 x 2(4-1)/4 = 15 GB/s
    (fit,) = fit_sweep(rows("all_reduce", 50.0, 1 / 10e3), "nvlink", 4)
    assert fit.busbw_gbps == pytest.approx(15.0)


def test_base_and_alpha_are_separated_by_sendrecv():
    # planner: all_reduce(n=2) = base + 2 alpha + S/bw; sendrecv = base + alpha + S/bw'
    base, alpha = 40.0, 120.0
    fits = fit_sweep(rows("all_reduce", base + 2 * alpha, 1 / 1.5e3) + rows("sendrecv", base + alpha, 1 / 3e3),
                     "node", 2)
    c = link_constants(fits, default_base_us=25.0)
    assert c.base_us == pytest.approx(base) and c.alpha_us["node"] == pytest.approx(alpha)
    assert c.bandwidth_gbps["node"] == pytest.approx(1.5)  # from all_reduce: its busbw at n=2


def test_all_to_all_enters_the_link_system_with_n_minus_1_latencies():
    # planner: all_to_all(n=4) = base + 3 alpha + 3/4 S / bw; all_reduce(n=4) = base + 6 alpha + 6/4 S / bw
    base, alpha = 30.0, 10.0
    fits = fit_sweep(rows("all_reduce", base + 6 * alpha, 1 / 8e3) + rows("all_to_all", base + 3 * alpha, 1 / 4e3),
                     "nvlink", 4)
    c = link_constants(fits, default_base_us=25.0)
    assert c.base_us == pytest.approx(base) and c.alpha_us["nvlink"] == pytest.approx(alpha)
    (a2a,) = [f for f in fits if f.op == "all_to_all"]
    assert a2a.busbw_gbps == pytest.approx(4.0 * 3 / 4)  # nccl-tests: busbw = algbw (n-1)/n


def test_underdetermined_keeps_the_default_base():
    fits = fit_sweep(rows("all_reduce", 525.0, 1 / 1e3), "node", 2)
    c = link_constants(fits, default_base_us=25.0)
    assert c.base_us is None and c.alpha_us["node"] == pytest.approx(250.0)


def test_group_sizes_and_classes_solve_jointly():
    base, a_nv, a_pix = 20.0, 3.0, 8.0
    fits = [CollectiveFit(op, cls, n, fit_line(SIZES, [base + k * a + s / 1e5 for s in SIZES]), len(SIZES))
            for op, cls, n, k, a in [("all_reduce", "nvlink", 2, 2, a_nv), ("all_reduce", "nvlink", 8, 14, a_nv),
                                     ("all_reduce", "pix", 2, 2, a_pix), ("all_reduce", "pix", 4, 6, a_pix)]]
    c = link_constants(fits, default_base_us=25.0)
    assert c.base_us == pytest.approx(base)
    assert c.alpha_us == pytest.approx({"nvlink": a_nv, "pix": a_pix})
