"""Cross-check runs with torch's own data parallelism on the runtime's model and data:
`python reference_run.py {ddp,zero1,fsdp2} RANKS STEPS LR SEED OUT.json` trains GPT with
DDP + Adam, DDP + ZeroRedundancyOptimizer(Adam) or FSDP2 (fully_shard per unit) on gloo and writes
the per-step loss of the global batch (mean over ranks)."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.data import global_batch, micro_batch
from runtime.model import GPT, GPTConfig
from tests.runtime.conftest import TINY


def train(rank: int, impl: str, world: int, steps: int, lr: float, seed: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(seed)
        cfg = {k: v for k, v in TINY.items() if k != "micro_batch"}
        model = GPT(GPTConfig(**cfg))
        if impl == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for unit in model.units:
                fully_shard(unit, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        else:
            model = torch.nn.parallel.DistributedDataParallel(model)
            if impl == "zero1":
                from torch.distributed.optim import ZeroRedundancyOptimizer

                opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr,
                                              foreach=False)
            else:
                opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
        losses = []
        b = TINY["micro_batch"]
        for step in range(steps):
            tokens = global_batch(seed=seed, step=step, sequences=b * world, seq_len=TINY["seq_len"],
                                  vocab=TINY["vocab"])
            x, y = micro_batch(tokens, micro=0, dp_rank=rank, dp=world, size=b)
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / world)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(losses, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    impl, world, steps, lr, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6]
    from runtime.launch import free_port

    mp.spawn(train, args=(impl, world, steps, lr, seed, free_port(), out), nprocs=world)
