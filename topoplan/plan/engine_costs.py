"""An engine profile (topoplan.engines) as the cost model reads it: its constants as a Calibration (which a
calibration file then overrides key by key) and its memory policy under that calibration."""

from __future__ import annotations

import math
from dataclasses import replace

from topoplan.engines.engine import Engine, MemoryPolicy
from topoplan.plan.calibration import Calibration


def engine_calibration(profile: Engine) -> Calibration:
    """The cost model's constants for this engine (links and bus efficiency stay the hardware's)."""
    o = profile.overheads
    return replace(Calibration(), memory_bandwidth_efficiency=o.memory_bandwidth_efficiency,
                   flop_efficiency=o.flop_efficiency, layer_overhead_us=o.layer_overhead_us,
                   decode_layer_overhead_us=o.graph_layer_overhead_us if profile.cuda_graphs_decode else None,
                   step_overhead_us=o.step_overhead_us, step_overhead_per_rank_us=o.step_overhead_per_rank_us,
                   sequence_overhead_us=o.sequence_overhead_us,
                   collective_base_us=o.collective_base_us, runtime_reserve=round(1 - profile.memory.fraction, 9))


def memory_policy(profile: Engine, calibration: Calibration) -> MemoryPolicy:
    """The engine's memory policy; a calibration whose runtime_reserve differs from the engine's default
    (a measured reserve, or `--calibration` setting it) fixes the fraction to 1 - runtime_reserve."""
    policy = profile.memory
    fraction = 1 - calibration.runtime_reserve
    if math.isclose(fraction, policy.fraction, abs_tol=1e-9):
        return policy
    return replace(policy, fraction=fraction, fraction_by_tp=())
