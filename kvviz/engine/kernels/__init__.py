"""Matrix kernels of kvviz's own, built from C at first use (build.py): int8, the int8 matrices' products on a CPU;
f32, a float32 row times a matrix packed for it on an AVX2 CPU."""
