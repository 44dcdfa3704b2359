"""A CPU host's cores, shared by each rank's compute and its gloo collectives.

On a GPU the compute stream and NCCL's kernels run side by side. On a CPU host they are threads:
a rank's intra-op threads (`threads_per_rank`) compute while gloo's worker thread moves and reduces
the collective's bytes (memcpy and sums through loopback TCP: CPU work, not waiting). The OS shares
the cores among the threads that are running (processor sharing: Kleinrock, "Queueing Systems"
vol. 2, §4.4), so an op that overlaps a collective slows down, and so does the collective.

Modelled as a fluid resource per rank, in zsim.fabric.sharing's max-min fair model (the same one
that shares links): rank r's cores are the link ("cpu", r) with capacity cores / ranks
(threads that run at once: the OS spreads the ranks over the cores), a compute op is work capped
at `threads`, a collective work capped at one thread, each sized so that alone it takes the seconds
the host model gives it (`work`). Together on a rank with fewer cores than threads, they share, the
collective getting the host's `gloo_core_share` (0.5, even processor sharing, unless calibrated: the
runtime's traces on this machine give gloo 0.16-0.23, its thread waiting on a peer's that is starved
too), a compute op weighing compute_weight collectives. Class mode simulates rank 0, whose peers do the
same at the same moments; per-rank mode gives
every rank its own link, and a collective's work crosses every member's (it moves at the pace of
its most loaded member).

`speeds` gives the same shares in closed form, for the calibration that removes them from measured
times (zsim.calibrate.host_calibration)."""

from __future__ import annotations

from collections.abc import Hashable


def cpu_link(rank: int) -> Hashable:
    """The fabric link that stands for rank `rank`'s share of the host's cores."""
    return ("cpu", rank)


def core_capacities(cores: int, ranks: int, per_rank: bool) -> dict[Hashable, float]:
    """Link → capacity (threads that can run at once) of every simulated rank's share of the cores:
    `cores / ranks` each (rank 0 only in class mode)."""
    share = cores / max(1, ranks)
    return {cpu_link(r): share for r in range(ranks if per_rank else 1)}


def work(seconds: float, share: float, threads: int) -> float:
    """The fluid work of an op that takes `seconds` alone, capped at `threads` threads, on a rank
    with `share` cores: what it moves at its speed alone, min(threads, share)."""
    return seconds * min(float(threads), share)


def compute_weight(gloo: float) -> float:
    """The weight of a compute op against a collective's 1 on a rank's cores, so that a collective gets
    `gloo` of them while both run (zsim.fabric.sharing's weighted max-min: equal rates per stream,
    a compute op standing for (1 − gloo)/gloo streams). 1 at gloo = 0.5: processor sharing."""
    return (1.0 - gloo) / gloo


def speeds(share: float, threads: int, gloo: float = 0.5) -> tuple[float, float]:
    """(compute speed, collective speed) as fractions of their speed alone, while a rank's compute
    (`threads` threads) and one collective (one thread) run together on `share` cores, the collective
    getting `gloo` of them (the host's `gloo_core_share`; 0.5, processor sharing, where not measured):
    the rates of zsim.fabric.sharing for two flows with caps `threads` and 1 on capacity `share`,
    weighted by compute_weight."""
    alone_compute, alone_comm = min(float(threads), share), min(1.0, share)
    comm, compute = gloo * share, (1.0 - gloo) * share  # progressive filling, unless a cap is below its share
    if compute >= threads:
        compute, comm = float(threads), min(1.0, share - threads)
    elif comm >= 1.0:
        comm, compute = 1.0, min(float(threads), share - 1.0)
    return compute / alone_compute, comm / alone_comm
