"""`heap`: free pages below a live allocation stay resident until trimmed, and the trimming
thread is one per process and keeps trimming. This machine's C library is glibc."""

from __future__ import annotations

import threading

import psutil

from tests.waiting import wait_until
from torpor.processors import heap

BLOCK = 64 << 10  # under glibc's mmap threshold: from an arena, not a mapping of its own
BLOCKS = 2048  # 128 MiB


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def test_trimming_gives_back_free_pages_that_free_did_not() -> None:
    """A thread fills its arena, frees all but the last block (which keeps the arena's top
    in use, so `free` gives nothing back: 128 MiB stay resident without a trim), and waits.
    After the trim what is resident is about what it was before the fill. (A trimming thread
    of this process may have trimmed first: the same call, the same result.)"""
    held: list[bytes] = []
    start = _rss()
    filled, release = threading.Event(), threading.Event()

    def fill() -> None:
        # Written, so resident: bytes(n) would come from calloc, whose fresh pages are never touched.
        blocks = [b"\x01" * BLOCK for _ in range(BLOCKS)]
        held.append(blocks[-1])
        del blocks
        filled.set()
        release.wait()

    worker = threading.Thread(target=fill)
    worker.start()
    try:
        assert filled.wait(60)
        assert heap.trim_heap()
        after = _rss()
        assert after - start <= BLOCKS * BLOCK // 4, (start, after)
    finally:
        release.set()
        worker.join()


def test_one_trimming_thread_per_process_that_keeps_trimming() -> None:
    # Once started it runs for the rest of the test session: a second, not a busier pace.
    assert heap.keep_heap_trimmed(interval_s=1.0)
    assert heap.keep_heap_trimmed()  # found running: not a second one
    named = [t for t in threading.enumerate() if t.name == "torpor-heap-trim"]
    assert len(named) == 1 and named[0].daemon
    start = heap.trims()
    wait_until(lambda: heap.trims() >= start + 2, timeout=60, message="the thread to trim twice more")
