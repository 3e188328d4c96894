"""The engine's GPU decodes never write memory that queued work still reads (GPU only).

nvJPEG's hardware engine writes a batched decode's outputs when the call is made, not in the
order of the stream it is given (docs/GPU.md, "The decode stream"). The torch-free engine is
safe from that because nvImageCodec decodes on a stream of its own, into memory allocated on
that stream from a pool that hands one stream's freed memory to another only once the free
has run. tests/decode_order.py probes it: see its docstring.
"""

from __future__ import annotations

import pytest
from decode_order import FILL, StreamHold, probe, start_stage

pytestmark = pytest.mark.gpu_driver


@pytest.fixture(scope="module")
def stage():
    started, why = start_stage()
    if started is None:
        pytest.skip(why)
    yield started
    started.close()


def test_a_held_stream_runs_nothing_queued_until_released(stage):
    """The probe's premise: work queued behind a StreamHold has not run while it holds."""
    device, stream = stage.device, stage.stream
    nbytes = 1 << 20
    victim = device.alloc(nbytes, stream)
    device.memset(victim, FILL, nbytes, stream)
    stream.synchronize()
    hold = StreamHold(device, stream, timeout=30)
    read = device.pinned(nbytes)
    try:
        device.memset(victim, 0, nbytes, stream)  # queued behind the hold
        device.copy_to_host(read.ptr, victim, nbytes, stage.decode_stream)  # another stream
        stage.decode_stream.synchronize()
        assert (read.array() == FILL).all()
    finally:
        hold.release()
    stream.synchronize()
    device.copy_to_host(read.ptr, victim, nbytes, stream)
    stream.synchronize()
    assert not read.array().any()
    assert not hold.timed_out
    device.free(victim, stream)
    read.close()


@pytest.mark.parametrize("round_", range(3))
def test_decodes_on_the_engines_decode_stream_leave_queued_reads_intact(stage, round_):
    result = probe(stage, stage.decode_stream)
    assert result.decoded == 8
    assert result.corrupted == 0, result
    assert result.reused == 0, result  # the victims' frees had not run: not handed out
