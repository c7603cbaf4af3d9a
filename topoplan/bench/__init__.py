"""Measure, calibrate, validate: collective sweeps, hardware probes, the alpha-beta fit, predicted vs measured."""
