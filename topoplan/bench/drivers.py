"""Which module runs a serving engine on this machine for `calibrate --engine` and `validate --engine`.

An Engine names its driver (Engine.driver, a module of this package) when one exists; the module offers
`calibrate_served(engine, calibration, ...)` and `validate_served(engine, model, calibration, ...)`. The bundled
runner is measured by topoplan.bench.calibrate and topoplan.bench.validate themselves.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from topoplan.engines import ENGINES, Engine
from topoplan.errors import TopoplanError


def driver_of(engine: Engine, command: str) -> ModuleType:
    """The driver module of a serving engine; a one-line error naming the engines `command` can run here."""
    if engine.driver is None:
        served = ", ".join(str(e) for e in ENGINES if e.driver)
        raise TopoplanError(f"--engine {engine}: {command} measures the runner (topoplan) or an engine it can start "
                            f"on this machine ({served}); it has no driver for {engine}")
    return import_module(f"{__package__}.{engine.driver}")
