"""Matrix kernels of kvviz's own, built from C at first use (int8: the int8 matrices' one-row products on a CPU)."""
