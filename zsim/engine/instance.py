"""One group instance of a collective in per-rank mode, driven by event callbacks.

What `zsim.engine.simulation._instance` (a generator process) did: wait each phase's latency, move its
bytes over the fabric, then release the group's members with the start time. Per-rank mode runs one
per group instance per collective (49,600 at the 1024-GPU flagship's MP 16), and a simpy process costs
two events of its own (its Initialize and its end) and a generator resume per step; callbacks on the
same events cost neither. The order of everything is the process's: the first phase begins from an
urgent event scheduled where the process's Initialize was (simpy.events.Initialize), each later step
runs in the callback of the event it waited on, where the process resumed (tests/test_engine_bits.py
holds the results to the bit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy
from simpy.events import URGENT

if TYPE_CHECKING:
    from zsim.fabric.collective import Phase
    from zsim.fabric.sharing import Fabric


class _Instance:
    """The state of one group instance: its phases, the next step, when it began, what to release."""

    __slots__ = ("env", "fabric", "phases", "step", "start", "finished")

    def __init__(self, env: simpy.Environment, fabric: Fabric, phases: list[Phase], finished: simpy.Event):
        self.env, self.fabric, self.phases, self.finished = env, fabric, phases, finished
        self.step = 0  # 2 × phase index, + 1 once its latency has passed
        self.start = 0.0

    def begin(self, _event: simpy.Event) -> None:
        self.start = self.env.now
        self.advance(_event)

    def advance(self, _event: simpy.Event) -> None:
        """Go on from the event just processed to the next one to wait for, or release the members."""
        phases = self.phases
        while self.step < 2 * len(phases):
            phase = phases[self.step // 2]
            latency = not self.step % 2
            self.step += 1
            if latency and phase.latency_s > 0:
                simpy.Timeout(self.env, phase.latency_s).callbacks.append(self.advance)
                return
            if not latency and phase.nbytes > 0:
                done = self.fabric.start(phase.links, phase.nbytes, phase.cap_Bps)
                if done is not None:
                    done.callbacks.append(self.advance)
                    return
        self.finished.succeed(self.start)


def start_instance(env: simpy.Environment, fabric: Fabric, phases: list[Phase], finished: simpy.Event) -> None:
    """Run a group instance's phases from now (after the urgent events before it, as a new process
    would start), then succeed `finished` with the time it began."""
    kick = simpy.Event(env)
    kick._ok = True  # what Initialize sets up: a triggered event, scheduled urgent
    kick._value = None
    kick.callbacks.append(_Instance(env, fabric, phases, finished).begin)
    env.schedule(kick, URGENT)
