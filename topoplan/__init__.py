"""topoplan: read a multi-GPU machine's topology, plan TP x PP x DP layouts, launch, run and measure them."""

__version__ = "0.1.0"
