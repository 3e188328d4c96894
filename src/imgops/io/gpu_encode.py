"""JPEG encode on the GPU with nvImageCodec (nvJPEG's encoder), for `-f jpg` on CUDA.

`GpuJpegEncoder.encode` takes device tensors (gray (H, W) or RGB (H, W, 3), uint8), encodes
them in one batched call on the given CUDA stream and returns the JPEG bytes of each (None for
an image it could not encode: the caller encodes that one on the CPU with OpenCV). The bytes
are not those of OpenCV's encoder: JPEG output is lossy either way, PNG is the exact format.

Which nvImageCodec backends: nvImageCodec files nvJPEG's CUDA encoder (``nvjpeg_cuda_encoder``)
under ``BackendKind.HYBRID_CPU_GPU`` and nvJPEG's hardware encoder (only on GPUs that have one)
under ``HW_GPU_ONLY``. ``GPU_ONLY`` holds no JPEG encoder at all (on x86 only nvJPEG2000's and
nvTIFF's), so ``Encoder(backends=[GPU_ONLY])`` fails with status 7, ARCH_MISMATCH ("requested
backends not among available processors"), on every GPU. No ``backends`` argument would let
nvImageCodec fall back to its own OpenCV CPU encoder inside the call, on the device thread;
asking for the two nvJPEG kinds only leaves every failure to imgops' OpenCV encode threads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .gpu_decode import GpuDecoderUnavailable, _quiet_stderr, driver_device_count, module, version

__all__ = [
    "GPU_BACKEND_KINDS",
    "MAX_GPU_IMAGE_BYTES",
    "GpuEncoderUnavailable",
    "GpuJpegEncoder",
    "backend_kinds",
    "status",
]

# nvJPEG's hardware encoder first (where the GPU has one), then nvJPEG's CUDA encoder.
GPU_BACKEND_KINDS = ("HW_GPU_ONLY", "HYBRID_CPU_GPU")

# nvJPEG's buffer-size estimate overflows 32 bits a little above 1 GiB of RGB input and then
# fails with an execution error that can take other CUDA work down with it (NVIDIA
# CUDALibrarySamples issue 360); larger images are left to OpenCV, well below that size.
MAX_GPU_IMAGE_BYTES = 1 << 29

# nvimgcodecStatus_t values (nvimgcodec.h) that nvImageCodec's "Code: N" reports at creation.
_STATUS = {
    1: "not initialized",
    2: "invalid parameter",
    5: "allocator failure",
    6: "execution failed",
    7: "no JPEG encoder for the requested backends (ARCH_MISMATCH)",
    8: "internal error (CUDA driver or GPU unavailable?)",
    9: "implementation unsupported",
    10: "missed dependencies",
}


class GpuEncoderUnavailable(GpuDecoderUnavailable):
    """nvImageCodec's JPEG encoder cannot start here; the message says why (one line)."""


def backend_kinds(cpu_backend: bool = False) -> tuple[str, ...]:
    """Names of the nvImageCodec BackendKinds the encoder asks for (the CPU one in tests)."""
    return ("CPU_ONLY",) if cpu_backend else GPU_BACKEND_KINDS


def _explain(error: Exception, kinds: Sequence[str]) -> str:
    """One line from nvImageCodec's creation error, with the status code spelt out."""
    text = str(error).split(" at /")[0].strip()  # drop the build machine's source path
    found = re.search(r"Code: (\d+)", text)
    if found is None:
        return text
    code = int(found.group(1))
    reason = f"{text} = {_STATUS.get(code, 'unknown status')}"
    if code == 7 and "CPU_ONLY" not in kinds:
        reason += (
            f"; backends asked: {', '.join(kinds)}. nvJPEG's encoder registers only when its"
            " library loads: is nvidia-nvjpeg (libnvjpeg.so.13) installed? PYNVIMGCODEC_VERBOSITY=3"
            " shows nvImageCodec's extension log"
        )
    return reason


def status(device_id: int = 0) -> tuple[bool, str]:
    """(usable, one line why) for `imgops doctor`: whether the GPU JPEG encoder starts and which
    nvJPEG encoder serves it (the hardware engine, else the CUDA encoder)."""
    try:
        nv = module()
    except GpuDecoderUnavailable as error:
        return False, str(error)
    if driver_device_count() <= device_id:
        return False, f"nvImageCodec {version()}: no CUDA GPU {device_id}, JPEG encode on the CPU"
    try:
        GpuJpegEncoder(device_id=device_id)
    except GpuDecoderUnavailable as error:
        return False, str(error)
    try:
        with _quiet_stderr():
            nv.Encoder(device_id=device_id, backends=[nv.Backend(nv.BackendKind.HW_GPU_ONLY)])
        which = "nvJPEG hardware encoder (CUDA encoder as fallback)"
    except Exception:  # status 7: this GPU has no JPEG encode engine
        which = "nvJPEG CUDA encoder (no hardware JPEG encoder on this GPU)"
    return True, f"nvImageCodec {version()}: JPEG encode on GPU {device_id}, {which}"


class GpuJpegEncoder:
    """One nvImageCodec JPEG encoder at a fixed quality; owned by one thread.

    `cpu_backend=True` uses nvImageCodec's CPU backend instead (no GPU needed: the tests drive
    every code path here that way); it then takes host tensors. `threads` caps nvImageCodec's
    own worker threads (0: one per core), which encode the images of a batch in parallel.
    """

    def __init__(
        self,
        quality: int = 95,
        device_id: int = 0,
        *,
        cpu_backend: bool = False,
        threads: int = 0,
        optimized_huffman: bool = True,
    ):
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"JPEG quality must be 1..100, not {quality}")
        nv = module()
        self._nv = nv
        self.cpu_backend = cpu_backend
        self.device_id = device_id
        kinds = backend_kinds(cpu_backend)
        backends = [nv.Backend(getattr(nv.BackendKind, kind)) for kind in kinds]
        device = nv.NVIMGCODEC_DEVICE_CPU_ONLY if cpu_backend else device_id
        try:
            with _quiet_stderr():  # nvImageCodec logs its own copy of the failure
                self._encoder = nv.Encoder(
                    device_id=device, max_num_cpu_threads=threads, backends=backends
                )
        except Exception as error:
            where = "the CPU" if cpu_backend else f"GPU {device_id}"
            raise GpuEncoderUnavailable(
                f"nvImageCodec {version()} cannot encode JPEG on {where}: {_explain(error, kinds)}"
            ) from None
        self.quality = int(quality)
        self._params = {
            gray: nv.EncodeParams(
                quality_type=nv.QualityType.QUALITY,
                quality_value=float(quality),
                chroma_subsampling=nv.ChromaSubsampling.CSS_GRAY
                if gray
                else nv.ChromaSubsampling.CSS_420,  # OpenCV's default sampling, 4:2:0
                jpeg_encode_params=nv.JpegEncodeParams(optimized_huffman=optimized_huffman),
            )
            for gray in (False, True)
        }

    def accepts(self, tensor: Any) -> bool:
        """Whether `encode` sends this tensor to nvImageCodec (else it returns None for it):
        uint8, (H, W) or (H, W, 3), not empty, at most MAX_GPU_IMAGE_BYTES, and on this
        encoder's GPU (on the host for the CPU backend)."""
        if tensor is None or str(tensor.dtype) != "torch.uint8":
            return False
        if not (tensor.dim() == 2 or (tensor.dim() == 3 and tensor.shape[2] == 3)):
            return False
        if tensor.numel() == 0 or tensor.numel() > MAX_GPU_IMAGE_BYTES:
            return False
        if self.cpu_backend:
            return not tensor.is_cuda
        return tensor.is_cuda and tensor.device.index == self.device_id

    def encode_arrays(self, arrays: Sequence[Any], cuda_stream: int = 0) -> list[bytes | None]:
        """JPEG bytes of device images given by `__cuda_array_interface__` (uint8, (H, W, 1)
        gray or (H, W, 3) RGB, rows may be pitched), as `encode` does for tensors; None where
        it failed or the image is empty or over MAX_GPU_IMAGE_BYTES (OpenCV encodes those)."""
        out: list[bytes | None] = [None] * len(arrays)
        for gray in (False, True):
            picked = []
            for i, array in enumerate(arrays):
                shape = tuple(array.__cuda_array_interface__["shape"])
                size = shape[0] * shape[1] * shape[2]
                wanted = shape[2] in (1, 3) and (shape[2] == 1) == gray
                if wanted and 0 < size <= MAX_GPU_IMAGE_BYTES:
                    picked.append(i)
            if not picked:
                continue
            wrapped = [self._nv.as_image(arrays[i], cuda_stream=cuda_stream) for i in picked]
            self._encode_into(out, picked, wrapped, gray, cuda_stream)
        return out

    def _encode_into(
        self, out: list, picked: list[int], wrapped: list, gray: bool, cuda_stream: int
    ) -> None:
        """One batched encode call; its bytes go to out[picked[k]] (nothing where it failed:
        OpenCV encodes those)."""
        try:
            streams = self._encoder.encode(
                wrapped, ".jpg", params=self._params[gray], cuda_stream=cuda_stream
            )
        except Exception:  # the whole call failed: OpenCV encodes these
            return
        for i, stream in zip(picked, streams, strict=True):
            out[i] = bytes(stream) if stream is not None else None

    def encode(self, images: Sequence[Any], cuda_stream: int = 0) -> list[bytes | None]:
        """JPEG bytes of each tensor ((H, W) gray or (H, W, 3) RGB uint8), None where it failed
        or where `accepts` refuses it. The encode waits for work queued on `cuda_stream` (an
        int cudaStream_t) before it reads the pixels; it returns once the bytes are on the host.
        """
        out: list[bytes | None] = [None] * len(images)
        for gray in (False, True):
            picked = [i for i, t in enumerate(images) if self.accepts(t) and (t.dim() == 2) == gray]
            if not picked:
                continue
            wrapped = []
            for i in picked:
                tensor = images[i].unsqueeze(-1) if gray else images[i]
                tensor = tensor.contiguous()
                source = tensor if tensor.is_cuda else tensor.numpy()
                wrapped.append(self._nv.as_image(source, cuda_stream=cuda_stream))
            self._encode_into(out, picked, wrapped, gray, cuda_stream)
        return out
