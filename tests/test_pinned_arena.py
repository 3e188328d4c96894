"""The pinned arena (imgops.engine.buffers.PinnedArena): one allocation pinned while the GPU
starts, handed out to the device engines' pool in pieces of whole granules."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from imgops.engine.buffers import BufferPool, PinnedArena


class Memory:
    """Stands in for a cuda_driver.PinnedBuffer: host memory with ptr, nbytes, close()."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.zeros(nbytes, np.uint8)
        self.ptr, self.nbytes = self.array.ctypes.data, nbytes
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def test_pieces_are_whole_granules_first_fit_and_come_back_merged():
    memory = Memory(10 * 16)
    arena = PinnedArena(memory, granule=16)
    a, b, c = arena.take(1), arena.take(17), arena.take(16)
    assert (a.nbytes, b.nbytes, c.nbytes) == (16, 32, 16)
    assert (a.ptr, b.ptr, c.ptr) == (memory.ptr, memory.ptr + 16, memory.ptr + 48)
    assert arena.free_bytes() == 6 * 16 and arena.taken == 3
    assert arena.take(7 * 16) is None  # no run of 7 free granules
    b.close()
    b.close()  # idempotent: given back once
    assert arena.free_bytes() == 8 * 16
    assert arena.take(32).ptr == memory.ptr + 16  # first fit: b's room again
    assert arena.take(64).ptr == memory.ptr + 64
    arena = PinnedArena(Memory(4 * 16), granule=16)
    pieces = [arena.take(16) for _ in range(4)]
    for piece in (pieces[1], pieces[3], pieces[0], pieces[2]):  # out of order: still merges
        piece.close()
    assert arena._free == [(0, 4)] and arena.take(64) is not None


def test_a_pieces_array_views_its_own_bytes_of_the_arena():
    memory = Memory(4 * 8)
    arena = PinnedArena(memory, granule=8)
    first, second = arena.take(8), arena.take(16)
    second.array()[:] = 7
    assert first.array().tolist() == [0] * 8 and second.array().size == 16
    assert memory.array[8:24].tolist() == [7] * 16 and memory.array[24:].sum() == 0
    second.close()
    try:
        second.array()
    except ValueError as error:
        assert "given back" in str(error)
    else:
        raise AssertionError("a given-back piece still gave a view")
    arena.close()
    assert memory.closes == 1


@given(
    granules=st.integers(1, 40),
    steps=st.lists(st.tuples(st.booleans(), st.integers(1, 12 * 8)), max_size=60),
)
def test_pieces_never_overlap_and_all_of_the_arena_comes_back(granules, steps):
    granule = 8
    arena = PinnedArena(Memory(granules * granule + 5), granule=granule)  # a ragged tail
    assert arena.nbytes == granules * granule
    out: list = []
    for give_back, nbytes in steps:
        if give_back and out:
            out.pop(nbytes % len(out)).close()
            continue
        piece = arena.take(nbytes)
        if piece is None:  # then no free run is long enough
            need = -(-nbytes // granule)
            assert all(count < need for _, count in arena._free)
            continue
        assert piece.nbytes >= nbytes and piece.nbytes % granule == 0
        out.append(piece)
        spans = sorted((p.ptr, p.ptr + p.nbytes) for p in out)
        base = arena.memory.ptr
        assert spans[0][0] >= base and spans[-1][1] <= base + arena.nbytes
        assert all(end <= start for (_, end), (start, _) in zip(spans[:-1], spans[1:], strict=True))
        assert arena.free_bytes() == arena.nbytes - sum(p.nbytes for p in out)
    for piece in out:
        piece.close()
    assert arena.free_bytes() == arena.nbytes and len(arena._free) <= 1


def test_threads_taking_and_giving_back_pieces_keep_the_arena_whole():
    arena = PinnedArena(Memory(64 * 8), granule=8)

    def churn(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            piece = arena.take(int(rng.integers(1, 24)))
            if piece is not None:
                piece.array()[:] = seed  # a piece is its taker's alone
                assert set(piece.array().tolist()) == {seed}
                piece.close()

    threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert arena.free_bytes() == arena.nbytes and arena._free == [(0, 64)]


def test_the_pool_hands_out_arena_pieces_and_pins_its_own_past_the_arena():
    """As the torch-free engine wires them: the pool's allocate takes a piece, else pins."""
    arena = PinnedArena(Memory(3 * 8), granule=8)
    pinned: list[Memory] = []

    def allocate(nbytes: int):
        piece = arena.take(nbytes)
        if piece is None:
            pinned.append(Memory(nbytes))
            return pinned[-1]
        return piece

    pool = BufferPool(100, pin=True, granule=8, allocate=allocate, dispose=lambda b: b.close())
    first, second = pool.acquire(16), pool.acquire(16)  # the arena has room for one of them
    assert first.ptr == arena.memory.ptr and len(pinned) == 1 and second is pinned[0]
    pool.release(first)
    pool.release(second)
    pool.close()  # the piece goes back to the arena, the pinned buffer is freed
    assert arena.free_bytes() == arena.nbytes and pinned[0].closes == 1
