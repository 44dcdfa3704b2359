"""The real PyTorch runtime of zsim: a GPT-style model trained with ZeRO-DP stages 0-3 on
torch.distributed (NCCL on GPUs, gloo on CPUs), recording traces in the zsim trace schema.

Layout (docs/runtime.md): config.py (the validated run), model.py (GPT), data.py (synthetic tokens),
flat.py (flat per-layer parameter buffers), zero/ (one file per ZeRO stage or technique),
tensor_parallel.py (Megatron-style MP of a block),
comm.py (traced collectives), tracer.py + ledger.py (events and memory by category),
worker.py (one rank's training loop), launch.py (spawn ranks, teardown), merge.py (cross-rank facts).
"""
