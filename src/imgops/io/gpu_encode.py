"""JPEG encode on the GPU with nvImageCodec (nvJPEG's encoder), for `-f jpg` on CUDA.

`GpuJpegEncoder.encode` takes device tensors (gray (H, W) or RGB (H, W, 3), uint8), encodes
them in one batched call on the given CUDA stream and returns the JPEG bytes of each (None for
an image it could not encode: the caller encodes that one on the CPU with OpenCV). The bytes
are not those of OpenCV's encoder: JPEG output is lossy either way, PNG is the exact format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .gpu_decode import GpuDecoderUnavailable, module, version

__all__ = ["GpuJpegEncoder"]


class GpuJpegEncoder:
    """One nvImageCodec JPEG encoder at a fixed quality; owned by one thread."""

    def __init__(self, quality: int = 95, device_id: int = 0, *, cpu_backend: bool = False):
        nv = module()
        self._nv = nv
        try:
            if cpu_backend:
                self._encoder = nv.Encoder(
                    device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                    backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                )
            else:
                self._encoder = nv.Encoder(
                    device_id=device_id, backends=[nv.Backend(nv.BackendKind.GPU_ONLY)]
                )
        except Exception as error:
            reason = str(error).split(" at /")[0]
            raise GpuDecoderUnavailable(
                f"nvImageCodec {version()} cannot encode JPEG on GPU {device_id}: {reason}"
            ) from None
        self.quality = quality
        self._params = {
            gray: nv.EncodeParams(
                quality_type=nv.QualityType.QUALITY,
                quality_value=float(quality),
                chroma_subsampling=nv.ChromaSubsampling.CSS_GRAY
                if gray
                else nv.ChromaSubsampling.CSS_420,
                jpeg_encode_params=nv.JpegEncodeParams(optimized_huffman=True),
            )
            for gray in (False, True)
        }

    def encode(self, images: Sequence[Any], cuda_stream: int = 0) -> list[bytes | None]:
        """JPEG bytes of each tensor ((H, W) gray or (H, W, 3) RGB uint8), None where it failed."""
        out: list[bytes | None] = [None] * len(images)
        for gray in (False, True):
            picked = [i for i, t in enumerate(images) if (t.dim() == 2) == gray]
            if not picked:
                continue
            wrapped = []
            for i in picked:
                tensor = images[i]
                tensor = tensor.unsqueeze(-1) if gray else tensor
                tensor = tensor.contiguous()
                source = tensor if tensor.is_cuda else tensor.numpy()
                wrapped.append(self._nv.as_image(source, cuda_stream=cuda_stream))
            try:
                streams = self._encoder.encode(
                    wrapped, ".jpg", params=self._params[gray], cuda_stream=cuda_stream
                )
            except Exception:
                continue
            for i, stream in zip(picked, streams, strict=True):
                out[i] = bytes(stream) if stream is not None else None
        return out
