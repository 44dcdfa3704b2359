"""The kernel-level compute model (docs/compute.md): what each MP rank's GPU executes per module and
pass (kernels.py), how long a GEMM takes (gemm.py), and the price of a kernel list (model.py)."""
