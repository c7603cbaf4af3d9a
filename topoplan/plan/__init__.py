"""Planning: enumerate TP x PP x DP layouts, place their ranks on GPUs, price them, rank them.

layouts -> placement -> cost (collectives, roofline) -> rank; calibration supplies every constant.
"""
