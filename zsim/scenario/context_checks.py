"""The checks of context parallelism (parallel.cp), as a whole: what Megatron-Core refuses, zsim refuses with its
reason; what zsim does not model is refused saying so (docs/parallel-layouts.md, "Context parallelism")."""

from __future__ import annotations

from zsim.config.model_section import ModelSection
from zsim.config.schema import ScenarioFile
from zsim.errors import Fail


def check_context_parallel(spec: ScenarioFile, model: ModelSection, host: bool, fail: Fail) -> None:
    """parallel.cp > 1 as Megatron-Core runs it: the sequence in 2·cp zig-zag chunks (megatron/core/utils.py
    get_batch_on_this_cp_rank: "The sequence length must be divisible by 2 * cp_size"), and under sequence
    parallelism each rank's share split again over MP; Transformer Engine's fused or flash attention with CP (zsim:
    FlashAttention); `model` has its attention resolved. Not modelled: sliding-window blocks, a CPU host, the runtime.

    Raises:
        ConfigError (through `fail`, naming the key) for each of those."""
    cp, par = spec.parallel.cp, spec.parallel
    if cp == 1:
        return
    split = 2 * cp * (par.mp if par.sequence_parallel and par.mp > 1 else 1)
    if model.seq_len % split:
        raise fail("model.seq_len", f"{model.seq_len} must divide into 2 × cp {cp}"
                   + (f" × mp {par.mp}" if split != 2 * cp else "") + f" = {split} equal chunks (Megatron-Core "
                   "splits each sequence into 2·cp zig-zag chunks for causal balance, then over MP under sequence "
                   "parallelism)")
    if model.attention not in ("flash2", "flash3"):
        raise fail("model.attention", f"{model.attention} with parallel.cp {cp}: context parallelism runs Transformer "
                   "Engine's fused attention kernels, which zsim models as FlashAttention (flash2 or flash3); the s×s "
                   "scores of unfused attention over a ring are not modelled")
    if model.sliding_window:
        raise fail("parallel.cp", f"{cp} with sliding-window attention (model.sliding_window): the ring's window "
                   "bookkeeping is not modelled")
    if host:
        raise fail("parallel.cp", f"{cp} on a CPU host: context parallelism is modelled on GPUs only")
