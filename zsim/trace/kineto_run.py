"""All ranks of one Kineto-traced job: collectives matched across ranks within each process group.

NCCL requires the members of a communicator to issue its collectives in the same order, so the k-th
collective of a group on each of its members is one collective; collectives of different groups are
never matched with each other (a rank in a DP and an MP group interleaves the two, and the two groups'
members differ). Its kernel starts on each GPU when that rank arrives and ends when the transfer
ends; the **last member to arrive waits for nobody**, so its kernel duration is the transfer time,
and every other member's extra time is waiting. That needs all ranks' files on one clock base
(torch.profiler's timestamps are host wall-clock microseconds).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from zsim.errors import ConfigError
from zsim.trace.json_file import rank_ranges
from zsim.trace.kineto import KinetoCollective, KinetoRank, read_rank
from zsim.trace.samples import CollectiveSample, ComputeSample


@dataclass(slots=True)
class KinetoRun:
    """All ranks of one job (or those given, with --allow-missing-ranks). `members()[k]` is the k-th
    collective of the job: (rank index in `ranks`, position in that rank's `collectives`) of every
    member present, in the order of their first kernel."""

    ranks: list[KinetoRank]
    _members: list[list[tuple[int, int]]] = field(default_factory=list)

    def members(self) -> list[list[tuple[int, int]]]:
        """Per collective, (index in `ranks`, position in its `collectives`) of each member present."""
        if not self._members and any(r.collectives for r in self.ranks):
            groups: dict[tuple, dict[int, list[int]]] = defaultdict(dict)
            for i, r in enumerate(self.ranks):
                for pos, c in enumerate(r.collectives):
                    groups[c.key].setdefault(i, []).append(pos)
            collectives = [list(zip(by_rank, column)) for by_rank in groups.values()
                           for column in zip(*by_rank.values())]  # the k-th of each member present
            self._members = sorted(collectives, key=lambda ms: min(self.ranks[i].collectives[p].start_us
                                                                    for i, p in ms))
        return self._members

    @property
    def world_size(self) -> int:
        return self.ranks[0].world_size

    def matched(self) -> list[list[KinetoCollective]]:
        """Every collective of the job: the kernels of its members present (read_kineto checked that they
        agree on op and size)."""
        return [[self.ranks[i].collectives[p] for i, p in ms] for ms in self.members()]

    def samples(self) -> list[CollectiveSample]:
        """One transfer time per collective: the duration of the last-arriving rank's kernel."""
        out = []
        for k, members in enumerate(self.matched()):
            last = max(members, key=lambda c: c.start_us)
            out.append(CollectiveSample(last.op, last.nbytes, last.group, last.dur_us * 1e-6, "nccl",
                                        str(self.ranks[0].path.parent), 1, last.dtype))
        return out

    def waiting_us(self) -> list[list[float]]:
        """Per collective, per rank: µs spent waiting for the last rank (kernel time − transfer)."""
        out = []
        for members in self.matched():
            last = max(members, key=lambda c: c.start_us)
            out.append([max(0.0, c.dur_us - last.dur_us) for c in members])
        return out

    def compute_samples(self) -> list[ComputeSample]:
        """Every non-NCCL GPU kernel of every rank as a measured duration (for trace-driven replay)."""
        return [ComputeSample("kernel", 0.0, float(k["dur"]) * 1e-6, "?", str(r.path), name=str(k["name"]))
                for r in self.ranks for k in r.kernels]


def read_kineto(paths: list[Path], allow_missing_ranks: bool = False) -> KinetoRun:
    """The ranks of one job from their Kineto files (or folders of `*.json`/`*.json.gz`).

    Raises:
        ConfigError: a file is not a Kineto trace; two files claim one rank; files of different jobs
        (world sizes differ); ranks missing (unless `allow_missing_ranks`: then waiting cannot be
        told apart from transfer, and the kernel durations include it); ranks that disagree on the
        sequence of collectives.
    """
    files: list[Path] = []
    for p in paths:
        files += sorted(q for q in p.iterdir() if q.name.endswith((".json", ".json.gz"))) if p.is_dir() else [p]
    if not files:
        raise ConfigError("no Kineto trace files (*.json, *.json.gz)", source=", ".join(map(str, paths)))
    ranks: dict[int, KinetoRank] = {}
    for f in files:
        r = read_rank(f)
        if r.rank in ranks:
            raise ConfigError(f"rank {r.rank} also in {ranks[r.rank].path}: files of two jobs mixed?", source=str(f))
        first = next(iter(ranks.values()), None)
        if first is not None and r.world_size != first.world_size:
            raise ConfigError(f"world size {r.world_size}, but {first.path} has {first.world_size}: "
                              "files of different jobs", source=str(f))
        ranks[r.rank] = r
    world = next(iter(ranks.values())).world_size
    missing = sorted(set(range(world)) - set(ranks))
    if missing and not allow_missing_ranks:
        raise ConfigError(f"ranks {rank_ranges(missing)} of {world} missing: without every rank the waiting for the "
                          "last one cannot be separated from the transfer (pass --allow-missing-ranks to use "
                          "kernel durations as they are, waiting included)", source=str(files[0].parent))
    run = KinetoRun([ranks[r] for r in sorted(ranks)])
    _check_counts(run, files[0].parent)
    for k, members in enumerate(run.matched()):
        kinds = {(c.op, c.nbytes) for c in members}
        if len(kinds) > 1:
            raise ConfigError(f"collective #{k} differs between ranks ({sorted(kinds)}): mixed or misordered traces",
                              source=str(files[0].parent))
    return run




def _check_counts(run: KinetoRun, folder: Path) -> None:
    """Every member of each process group present recorded as many of its collectives.

    Raises:
        ConfigError: naming the group and each rank's count.
    """
    counts: dict[tuple, dict[int, int]] = defaultdict(dict)
    for r in run.ranks:
        for c in r.collectives:
            counts[c.key][r.rank] = counts[c.key].get(r.rank, 0) + 1
    for (pg, ranks), by_rank in counts.items():
        present = {m: by_rank.get(m, 0) for m in ranks if m in {r.rank for r in run.ranks}}
        if len(set(present.values())) > 1:
            name = f"process group {pg!r} " if pg else "process group "
            raise ConfigError(f"ranks recorded different numbers of NCCL collectives of {name}(ranks "
                              f"{rank_ranges(list(ranks))}) {present}: truncated or mixed traces", source=str(folder))
