"""`python -m zsim.runtime`: launch a traced run on this machine, or be one rank of it.

- Without RANK in the environment: spawn --ranks processes here (like `zsim trace`).
- Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set): be that rank.
  `torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m runtime --stage 3
  --model m.yaml -o traces/x/`
- `--config FILE` (what the launcher passes its children): a RunConfig as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .cli import add_run_arguments, config_from_args
from .config import RunConfig
from zsim.errors import ZsimError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--config"]:
        from . import worker

        return worker.main(RunConfig.from_json(Path(argv[1]).read_text()), worker.RankEnv.from_environ())
    parser = argparse.ArgumentParser(prog="python -m zsim.runtime", description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if "RANK" in os.environ:
            from . import worker

            env = worker.RankEnv.from_environ()
            return worker.main(config_from_args(args, world_size=env.world_size), env)
        from .launch import launch

        result = launch(config_from_args(args), progress=True)
    except ZsimError as exc:
        print(f"runtime: {exc}", file=sys.stderr)
        return exc.exit_code
    if result.failure is not None:
        print(f"runtime: {result.failure}", file=sys.stderr)
        return 1
    print(f"traces written to {result.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
