"""Launch: per-rank environment, CPU/NUMA binding and launcher command lines (see docs/launch.md)."""
