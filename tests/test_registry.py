"""Every op of imgops.registry against its reference on its samples, per dtype and device; the
fake kernel (meta tensors) against the real output's shape and dtype; unsupported dtypes refused."""

from __future__ import annotations

import pytest
import torch

from imgops import registry

CASES = [
    pytest.param(info, dtype, id=f"{info.name}-{str(dtype)[6:]}")
    for info in registry.OPS
    for dtype in info.dtypes
]


def _assert_equal(info: registry.OpInfo, got: torch.Tensor, want: torch.Tensor, label: str):
    assert got.shape == want.shape and got.dtype == want.dtype, label
    if info.exact or not got.dtype.is_floating_point:
        assert torch.equal(got, want), label
    else:
        scale = want.abs().max().item() if want.numel() else 0.0
        atol = 64 * torch.finfo(torch.float64).eps * scale
        torch.testing.assert_close(got, want, rtol=2 * torch.finfo(got.dtype).eps, atol=atol)


@pytest.mark.parametrize(("info", "dtype"), CASES)
def test_op_equals_reference_on_every_sample(device, info, dtype):
    if device not in info.devices:
        pytest.skip(f"{info.name} has no {device} kernel")
    checked = 0
    for sample in info.samples(dtype):
        got = info(sample.to(device))
        _assert_equal(info, got.cpu(), info.expected(sample), f"{info.name} {sample.label}")
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("info", registry.OPS, ids=lambda i: i.name)
def test_fake_kernel_matches_the_real_output(info):
    sample = next(info.samples(info.dtypes[0]))
    real = info(sample)
    op = getattr(torch.ops.imgops, info.name).default
    meta = op(sample.input.to("meta"), *sample.args, **sample.kwargs)
    assert meta.shape == real.shape and meta.dtype == real.dtype


@pytest.mark.parametrize("info", registry.OPS, ids=lambda i: i.name)
def test_unsupported_dtype_is_refused_by_kernel_and_fake(info):
    sample = next(info.samples(info.dtypes[0]))
    bad = sample.input.to(torch.int32)
    with pytest.raises(TypeError):
        info(registry.Sample(bad, sample.args, sample.kwargs))
    op = getattr(torch.ops.imgops, info.name).default
    with pytest.raises((TypeError, RuntimeError, ValueError)):
        op(bad.to("meta"), *sample.args, **sample.kwargs)


@pytest.mark.parametrize("info", registry.OPS, ids=lambda i: i.name)
def test_every_op_has_benchmark_workloads(info):
    for device in info.devices:
        for quick in (True, False):
            cases = info.bench(device, quick)
            assert cases and all(case.op == info.name for case in cases)
