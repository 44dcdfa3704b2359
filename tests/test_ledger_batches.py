"""An op's allocations and frees go to the ledger as one batch (MemoryLedger.alloc_many/free_many): the
timeline, the peaks and the OOM must be what allocating and freeing the tensors one by one gives."""

from zsim.memory.ledger import MemoryLedger, Request

MiB = 1 << 20


def state(ledger: MemoryLedger) -> tuple:
    return (ledger.times, ledger.rows, ledger.reserved_rows, ledger.peak, ledger.peak_time, ledger.peak_by_category,
            ledger.peak_reserved, ledger.peak_reserved_time, ledger.oom, ledger.live)


def run(batched: bool) -> MemoryLedger:
    """A 100 MiB GPU with a cached, wholly free 50 MiB segment; then at t = 1 one op allocates 30 MiB
    and 40 MiB on the comm stream: the second cannot get a segment without releasing the cache, so
    reserved rises to 80 MiB and falls to 70 MiB within the op; at t = 2 it frees both."""
    ledger = MemoryLedger(capacity=100 * MiB)
    ledger.alloc(0.0, "activations", 50 * MiB, "warm")
    ledger.free(0.5, "warm")
    requests = [Request("buffers", 30 * MiB, "a", stream="comm"), Request("grads", 40 * MiB, "b", stream="comm")]
    if batched:
        ledger.alloc_many(1.0, requests)
        ledger.free_many(2.0, ["a", "b"])
    else:
        for r in requests:
            ledger.alloc(1.0, r.category, r.nbytes, r.tag, stream=r.stream)
        for tag in ("a", "b"):
            ledger.free(2.0, tag)
    return ledger


def test_a_batch_records_what_one_by_one_records():
    one, batch = run(batched=False), run(batched=True)
    assert state(batch) == state(one)
    assert batch.peak_reserved == 80 * MiB and batch.reserved_rows[-1] == 70 * MiB  # the peak inside the op


def test_an_oom_inside_a_batch_is_the_same():
    def fill(batched: bool) -> MemoryLedger:
        ledger = MemoryLedger(capacity=64 * MiB)
        requests = [Request("activations", 40 * MiB, f"t{i}") for i in range(3)]
        if batched:
            ledger.alloc_many(3.0, requests)
        else:
            for r in requests:
                ledger.alloc(3.0, r.category, r.nbytes, r.tag)
        return ledger

    one, batch = fill(False), fill(True)
    assert batch.oom is not None and batch.oom.tag == "t1"
    assert state(batch) == state(one)
