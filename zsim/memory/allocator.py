"""A model of PyTorch's CUDA caching allocator: what `torch.cuda.memory_reserved()` would show.

The rules follow c10/cuda/CUDACachingAllocator.cpp (PyTorch; the constants and functions named below
are that file's), for one device, without the optional settings
(max_split_size_mb, roundup_power2_divisions, expandable_segments, garbage collection):
  - every block belongs to the stream that was current when its segment was reserved, and a request
    only takes cached blocks of its own stream (BlockComparator orders by stream first; get_free_block
    searches the request's stream only): memory that the comm stream freed cannot serve the compute
    stream until the cache is released;
  - every request is rounded up to a multiple of 512 bytes (round_size, kMinBlockSize);
  - requests of at most 1 MiB (kSmallSize) use the small pool, larger ones the large pool (get_pool);
  - a request takes the smallest cached free block of its pool that is large enough, the lowest
    address among equal sizes (get_free_block: BlockComparator by size, then address);
  - with none, a new segment is reserved (cudaMalloc): 2 MiB for small requests (kSmallBuffer),
    20 MiB for requests under 10 MiB (kLargeBuffer, kMinLargeAlloc), otherwise the request rounded
    up to 2 MiB (kRoundLarge) (get_allocation_size);
  - a block larger than the request is split when the rest is at least 512 B (small pool) or more
    than 1 MiB (large pool) (should_split); the rest stays cached in the pool;
  - a freed block merges with free neighbours of its segment and stays cached (free_block,
    try_merge_blocks); segments are never returned to the device except
  - when a new segment does not fit, every cached segment that is wholly free is released and the
    reservation retried (release_cached_blocks); if it still does not fit, that is the OOM. Each such
    flush is counted (`flushes`): PyTorch frees those segments with cudaFree, which waits for the
    device, and reserves them again as they are needed; DeepSpeed warns of them as "detrimental to
    performance" (deepspeed/runtime/zero/stage3.py, num_alloc_retries). Their time is not simulated.
Device memory is `capacity` bytes; what the CUDA context and libraries hold outside the allocator is
taken from it with `reserve_outside` (zsim.memory.context).
Sizes are bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: 1 MiB, the largest "small" request
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small requests are packed in 2 MiB segments
LARGE_BUFFER = 20 << 20  # kLargeBuffer: requests of 1-10 MiB share 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments are rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """The block size of a request: a multiple of 512 bytes, at least 512 (round_size)."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def segment_size(size: int) -> int:
    """Bytes reserved by cudaMalloc for a rounded request that found no cached block (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


@dataclass(slots=True, eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    stream: str = "compute"
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


@dataclass(slots=True)
class CachingAllocator:
    """Blocks, segments and pools of one device. `reserved` is the sum of segments, `allocated` the
    sum of allocated blocks (rounded sizes, as torch.cuda.memory_allocated counts them)."""

    capacity: int
    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    flushes: int = 0  # reservations that did not fit and released the cache first (release_cached_blocks)
    _pools: dict[tuple[str, bool], list[tuple[int, int]]] = field(default_factory=dict)  # (stream, small) -> blocks
    _free: dict[int, _Block] = field(default_factory=dict)  # cached free blocks by address
    _live: dict[str, _Block] = field(default_factory=dict)  # allocated blocks by tag
    _next_addr: int = 0

    def malloc(self, tag: str, nbytes: int, stream: str = "compute") -> bool:
        """Allocate `nbytes` for `tag` on `stream` (its own pool). Returns False when no segment could
        be reserved within capacity even after releasing the cache (CUDA OOM); the block is then
        reserved anyway, beyond capacity, so that the run can go on and show by how much it does not fit."""
        assert tag not in self._live, tag
        size = MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * -(-nbytes // MIN_BLOCK)  # round_size, inlined
        small = size <= SMALL_SIZE
        # get_free_block: the smallest cached block of the pool that is large enough, lowest address first
        block = None
        pool = self._pools.get((stream, small))
        if pool:
            i = bisect.bisect_left(pool, (size, -1))
            if i < len(pool):
                block = self._free.pop(pool.pop(i)[1])
        ok = True
        if block is None:
            seg = segment_size(size)
            if self.reserved + seg > self.capacity:
                self.flushes += 1
                self.release_cached()
                ok = self.reserved + seg <= self.capacity
            block = _Block(self._next_addr, seg, small, stream)
            self._next_addr += seg
            self.reserved += seg
            self.segments += 1
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:  # should_split
            after = block.next
            remaining = _Block(block.addr + size, rest, small, block.stream, False, block, after)
            if after is not None:
                after.prev = remaining
            block.next, block.size = remaining, size
            self._insert(remaining)
        block.allocated = True
        self._live[tag] = block
        self.allocated += block.size
        return ok

    def reserve_outside(self, nbytes: int) -> bool:
        """Reserve `nbytes` of device memory that the caching allocator does not manage (MD's arenas),
        releasing the cache first if needed. Returns False when it does not fit (reserved anyway)."""
        ok = True
        if self.reserved + nbytes > self.capacity:
            self.flushes += 1
            self.release_cached()
            ok = self.reserved + nbytes <= self.capacity
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return ok

    def free(self, tag: str) -> None:
        """Free `tag`'s block: it merges with free neighbours and stays cached (free_block)."""
        block = self._live.pop(tag)
        block.allocated = False
        self.allocated -= block.size
        before, after = block.prev, block.next
        if before is not None and not before.allocated:  # try_merge_blocks, the block before
            self._remove(before)
            block.addr, block.prev = before.addr, before.prev
            if block.prev is not None:
                block.prev.next = block
            block.size += before.size
        if after is not None and not after.allocated:  # and the block after
            self._remove(after)
            block.next = after.next
            if block.next is not None:
                block.next.prev = block
            block.size += after.size
        self._insert(block)

    def release_cached(self) -> None:
        """Return every wholly free cached segment to the device (release_cached_blocks)."""
        for addr, block in list(self._free.items()):
            if block.prev is None and block.next is None:
                self._remove(block)
                self.reserved -= block.size
                self.segments -= 1

    def state(self, normalize: Callable[[str], str] = str) -> tuple:
        """The allocator's state up to addresses: every segment in address order, each as its blocks
        (size, stream, the `normalize`d tag of an allocated block or None for a cached one). Two equal
        states make the same decisions for the same requests (sizes, stream pools and the relative
        order of addresses are all the rules read), so a run whose state repeats at a step boundary
        repeats from there on."""
        owner = {id(b): normalize(tag) for tag, b in self._live.items()}
        heads = [b for b in list(self._free.values()) + list(self._live.values()) if b.prev is None]
        segments = []
        for head in sorted(heads, key=lambda b: b.addr):
            blocks, b = [], head
            while b is not None:
                blocks.append((b.size, b.stream, owner.get(id(b))))
                b = b.next
            segments.append(tuple(blocks))
        return tuple(segments)

    def largest_free_block(self) -> int:
        return max((b.size for b in self._free.values()), default=0)

    def _insert(self, block: _Block) -> None:
        pool = self._pools.get((block.stream, block.small))
        if pool is None:
            pool = self._pools[(block.stream, block.small)] = []
        bisect.insort(pool, (block.size, block.addr))
        self._free[block.addr] = block

    def _remove(self, block: _Block) -> None:
        pool = self._pools[(block.stream, block.small)]
        i = bisect.bisect_left(pool, (block.size, block.addr))
        assert pool[i] == (block.size, block.addr)
        pool.pop(i)
        del self._free[block.addr]
