"""`topoplan doctor`: what on this machine will slow or hang a multi-GPU launch, found before the launch.

The pipeline is the same as the topology's: a reader (reader.py) turns sysfs, procfs and NVML into one plain
dict, the recording; checks (checks/) judge only that recording, never the live system, so a saved recording
(`--save`, `--file`) replays every decision anywhere; render.py prints the findings. docs/doctor.md lists every
check with the note it comes from.
"""
