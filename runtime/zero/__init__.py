"""The ZeRO-DP engine, one file per stage or technique, readable next to the paper
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC'20):

engine.py         the training step shared by all stages: units, forward/backward hooks, tracing
stage0.py         plain data parallel: bucketed all-reduce of gradients, overlapped with backward
stage1.py         Pos (§5.1): optimizer states partitioned; reduce-scatter grads, all-gather params
stage2.py         Pos+g (§5.2): gradients partitioned as they are reduce-scattered in backward
stage3.py         Pos+g+p (§5.3): parameters partitioned, gathered per layer in forward and backward
buckets.py        gradient buckets (which layers reduce together) and the bucketed reducers
optimizer.py      Adam on flat fp32 partitions (fp32 master weights when mixed precision)
loss_scaler.py    dynamic loss scaling for fp16
checkpointing.py  activation checkpointing of a transformer block
activations.py    saved-tensor hooks: activation bytes, and stage 3's parameter handles
"""

from .stage0 import Stage0
from .stage1 import Stage1
from .stage2 import Stage2
from .stage3 import Stage3

ENGINES = {0: Stage0, 1: Stage1, 2: Stage2, 3: Stage3}

__all__ = ["ENGINES", "Stage0", "Stage1", "Stage2", "Stage3"]
