"""The caching-allocator model against the rules of c10/cuda/CUDACachingAllocator.cpp, and MD."""

from hypothesis import given, settings
from hypothesis import strategies as st

from zsim.memory.allocator import CachingAllocator, round_size, segment_size
from zsim.memory.ledger import MemoryLedger

MiB = 1 << 20


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024  # kMinBlockSize
    assert segment_size(512) == 2 * MiB  # small requests share a 2 MiB segment (kSmallBuffer)
    assert segment_size(MiB) == 2 * MiB and segment_size(MiB + 512) == 20 * MiB  # kLargeBuffer below 10 MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(10 * MiB + 1) == 12 * MiB  # kRoundLarge


def test_small_requests_pack_into_one_segment_and_split():
    a = CachingAllocator(capacity=1 << 30)
    for i in range(4):
        assert a.malloc(f"t{i}", 1000)  # rounded to 1024, split from one 2 MiB segment
    assert a.reserved == 2 * MiB and a.allocated == 4 * 1024 and a.segments == 1


def test_large_block_split_only_when_the_rest_exceeds_1_mib():
    a = CachingAllocator(capacity=1 << 30)
    a.malloc("x", 3 * MiB)  # 20 MiB segment: 17 MiB left, split
    a.free("x")
    a.malloc("y", 19 * MiB + 512)  # best fit in the merged 20 MiB block; rest < 1 MiB: not split
    assert a.reserved == 20 * MiB and a.allocated == 20 * MiB and a.segments == 1


def test_best_fit_prefers_the_smallest_cached_block():
    a = CachingAllocator(capacity=1 << 30)
    a.malloc("big", 40 * MiB)
    a.malloc("mid", 24 * MiB)
    a.free("big")
    a.free("mid")
    a.malloc("z", 22 * MiB)  # fits both; takes the 24 MiB one, whole (rest 2 MiB > 1 MiB: split)
    assert a.reserved == 64 * MiB and a.largest_free_block() == 40 * MiB


def test_oom_retries_after_releasing_the_cache():
    a = CachingAllocator(capacity=100 * MiB)
    a.malloc("a", 60 * MiB)
    a.free("a")  # cached, wholly free
    assert a.malloc("b", 80 * MiB)  # no fit in the cache: release the 60 MiB segment, then reserve
    assert a.reserved == 80 * MiB and a.segments == 1
    assert a.flushes == 1  # the release that made room is counted (PyTorch's cudaMalloc retry)


def test_flushes_count_only_reservations_that_did_not_fit():
    a = CachingAllocator(capacity=100 * MiB)
    a.malloc("a", 40 * MiB)
    a.free("a")
    a.malloc("b", 30 * MiB)  # served from the cache
    a.malloc("c", 50 * MiB)  # a new segment that fits beside it
    assert a.flushes == 0
    a.free("c")
    a.malloc("d", 58 * MiB)  # the cached 50 MiB segment is too small and 40 + 50 + 58 > 100: flush
    assert a.flushes == 1 and a.reserved == 98 * MiB


def test_the_ledger_times_each_flush():
    ledger = MemoryLedger(capacity=100 * MiB)
    ledger.alloc(0.0, "activations", 60 * MiB, "x")
    ledger.free(1.0, "x")
    ledger.alloc(2.0, "activations", 30 * MiB, "y")  # from the cache
    ledger.alloc(3.0, "activations", 80 * MiB, "z")  # 60 cached + 80 > 100, 30 of it in use: OOM even so
    assert ledger.flush_times == [3.0] and ledger.oom is not None


def fragmenting_sequence(ledger: MemoryLedger, long_arena: str = "") -> None:
    """Interleaved lifetimes (ZeRO §3.2, §6.3): short-lived 100 MiB activations and long-lived 20 MiB
    checkpoints, split one after another from one cached 700 MiB block; then a 200 MiB request."""
    ledger.alloc(0.0, "activations", 700 * MiB, "warmup")
    ledger.free(0.0, "warmup")  # one cached 700 MiB segment
    for i in range(5):
        ledger.alloc(0.0, "activations", 100 * MiB, f"work{i}")
        ledger.alloc(0.0, "activations", 20 * MiB, f"ckpt{i}", arena=long_arena)
    for i in range(5):
        ledger.free(0.0, f"work{i}")  # 100 MiB holes between the checkpoints
    ledger.alloc(0.0, "activations", 200 * MiB, "recompute")


def test_fragmentation_causes_oom_with_memory_free_and_md_removes_it():
    plain = MemoryLedger(capacity=850 * MiB)
    fragmenting_sequence(plain)
    assert plain.oom is not None and plain.oom.tag == "recompute"
    # OOM with most of the memory free: 300 MiB allocated of 850, 600 MiB cached in 100 MiB holes.
    assert plain.oom.total_bytes == 300 * MiB and plain.allocator.largest_free_block() == 100 * MiB
    md = MemoryLedger(capacity=850 * MiB)
    md.reserve_arena(0.0, "checkpoints", 5 * 20 * MiB)
    fragmenting_sequence(md, long_arena="checkpoints")
    assert md.oom is None and md.reserved == 800 * MiB and md.allocated == 300 * MiB


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 * MiB)), min_size=1, max_size=60))
def test_reserved_never_below_allocated_and_everything_comes_back(ops):
    ledger = MemoryLedger(capacity=1 << 40)
    live: list[str] = []
    for i, (free_one, nbytes) in enumerate(ops):
        if free_one and live:
            ledger.free(float(i), live.pop(0))
        else:
            ledger.alloc(float(i), "buffers", nbytes, f"t{i}")
            live.append(f"t{i}")
        assert ledger.reserved >= ledger.allocated >= 0
        assert ledger.allocator.allocated >= ledger.allocated  # blocks are rounded up
    for tag in live:
        ledger.free(9e9, tag)
    assert ledger.allocated == 0 and ledger.allocator.allocated == 0
    ledger.allocator.release_cached()
    assert ledger.allocator.reserved == 0  # every split block merged back into whole segments


def test_state_compares_layouts_not_addresses():
    """CachingAllocator.state: equal for the same blocks in the same order whatever their addresses, with
    allocated blocks named by the normalized tag; different when a block's size or owner differs."""
    def run(first_tags, tag="x"):
        a = CachingAllocator(1 << 30)
        for t in first_tags:  # reserve and free a segment first: later addresses differ, layout does not
            a.malloc(t, 30 * MiB)
            a.free(t)
            a.release_cached()
        a.malloc(f"{tag}.s0", 12 * MiB)
        a.malloc("y", 40 * MiB)
        a.free("y")
        return a

    norm = lambda tag: tag.split(".s")[0]  # noqa: E731
    assert run([]).state(norm) == run(["pad"]).state(norm)
    assert run([]).state(norm) != run([], tag="z").state(norm)
    b = run([])
    b.malloc("w", 1 * MiB)
    assert b.state(norm) != run([]).state(norm)
