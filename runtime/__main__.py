"""`python -m zsim.runtime`: launch a traced run on this machine, or be one rank of it.

- Without RANK in the environment: spawn --ranks processes here (like `zsim trace`).
- Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set): be that rank.
  `torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m runtime --stage 3
  --model m.yaml -o traces/x/`
- `--config FILE` (what the launcher passes its children): a RunConfig as JSON.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .cli import add_run_arguments, config_from_args
from .config import RunConfig
from zsim.errors import ZsimError


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a rank failed (named), 2 bad input (one or two lines, no traceback),
    128+N stopped by signal N."""
    from zsim.console.parser import Parser, error_text

    from .launch import Stopped

    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["--config"]:
            if len(argv) != 2:
                raise ZsimError("--config takes one file: python -m zsim.runtime --config DIR/config.json")
            from . import worker
            from zsim.config.yamlfile import read_text

            cfg = RunConfig.from_json(read_text(Path(argv[1]), what="run configuration"), source=argv[1])
            return worker.main(cfg, _rank_env(worker))
        parser = Parser(prog="python -m zsim.runtime", description=__doc__.splitlines()[0])
        add_run_arguments(parser)
        args = parser.parse_args(argv)
        if "RANK" in os.environ:
            from . import worker

            env = _rank_env(worker)
            return worker.main(config_from_args(args, world_size=env.world_size), env)
        from .launch import launch

        result = launch(config_from_args(args), progress=sys.stderr.isatty(), force=args.force)
    except ZsimError as exc:
        print(error_text(f"runtime: {exc}"), file=sys.stderr)
        return exc.exit_code
    except Stopped as exc:
        print(f"runtime: stopped by {exc}; every rank was stopped", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print("runtime: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    if result.failure is not None:
        print(error_text(f"runtime: {result.failure}"), file=sys.stderr)
        return 1
    print(f"traces written to {result.out_dir}")
    return 0


def _rank_env(worker):
    """This rank's place from the torchrun environment. Raises ZsimError when it is missing or bad."""
    try:
        return worker.RankEnv.from_environ()
    except (KeyError, ValueError) as exc:
        raise ZsimError(f"RANK, WORLD_SIZE (and LOCAL_RANK) must be set to integers, as torchrun does ({exc})") \
            from None


if __name__ == "__main__":
    sys.exit(main())
