"""nvImageCodec through its C API (imgops.io.nvimgcodec_c), on its CPU backend (no GPU needed).

Checked here: the ctypes structures against the wheel's own header (compiled with the C
compiler, where there is one), the decoder's acceptance against the Python module's, its pixels
against OpenCV's (EXIF orientations included), that its calls release the GIL, and the
torch-free engine running on it with the stand-in driver. The GPU backends run in
tests/test_cuda_driver.py and scripts/gpu-check.d on the GPU machine.
"""

from __future__ import annotations

import ctypes
import io
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from gil_probe import ticks_while

from imgops.io import gpu_decode, nvimgcodec_c

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
JPEGS = sorted(SAMPLES.glob("*.jpg"))
pytestmark = pytest.mark.skipif(
    nvimgcodec_c.package_dir() is None, reason="nvImageCodec not installed"
)


def _odd_files(folder: Path) -> dict[str, bytes]:
    """EXIF orientations 1..8, CMYK, truncated, not-JPEG, PNG and TIFF inputs."""
    from PIL import Image

    rgb = cv2.imread(str(SAMPLES / "rocket_baseline_rgb.jpg"))[:90, :130, ::-1].copy()
    files = {}
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, "JPEG", quality=90, exif=exif.tobytes())
        files[f"exif{orientation}.jpg"] = buffer.getvalue()
    buffer = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(buffer, "JPEG", quality=90)
    files["cmyk.jpg"] = buffer.getvalue()
    whole = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    files["truncated.jpg"] = whole[: len(whole) // 2]
    files["notjpeg.jpg"] = b"\xff\xd8\xff\xe0" + b"\x00" * 64
    files["coffee_rgb.png"] = (SAMPLES / "coffee_rgb.png").read_bytes()
    files["mri_dwi_b0_u16.tif"] = (SAMPLES / "mri_dwi_b0_u16.tif").read_bytes()
    return files


@pytest.fixture(scope="module")
def decoder() -> nvimgcodec_c.CDecoder:
    return nvimgcodec_c.CDecoder(cpu_backend=True, threads=2)


def _opencv(data: bytes, gray: bool) -> np.ndarray:
    flag = cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR
    return cv2.imdecode(np.frombuffer(data, np.uint8), flag)


def test_the_structures_match_the_wheels_header(tmp_path: Path):
    """The decoder's and the JPEG encoder's (imgops.io.nvimgcodec_encode_c) structures and
    constants: every size, offset and value as the header's."""
    from imgops.io import nvimgcodec_encode_c as encode_c

    compiler = shutil.which("cc") or shutil.which("gcc")
    header = Path(nvimgcodec_c.package_dir() or "", "include", "nvimgcodec.h")
    if compiler is None or not header.exists():
        pytest.skip("no C compiler or no nvimgcodec.h")
    (tmp_path / "cuda_runtime_api.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    fields = [
        ("nvimgcodecImageInfo_t", nvimgcodec_c._ImageInfo),
        ("nvimgcodecImagePlaneInfo_t", nvimgcodec_c._PlaneInfo),
        ("nvimgcodecOrientation_t", nvimgcodec_c._Orientation),
        ("nvimgcodecInstanceCreateInfo_t", nvimgcodec_c._InstanceCreateInfo),
        ("nvimgcodecBackendParams_t", nvimgcodec_c._BackendParams),
        ("nvimgcodecBackend_t", nvimgcodec_c._Backend),
        ("nvimgcodecExecutionParams_t", nvimgcodec_c._ExecutionParams),
        ("nvimgcodecDecodeParams_t", nvimgcodec_c._DecodeParams),
        ("nvimgcodecEncodeParams_t", encode_c._EncodeParams),
        ("nvimgcodecJpegEncodeParams_t", encode_c._JpegEncodeParams),
    ]
    lines = []
    expected = []
    for c_name, ours in fields:
        lines.append(f'printf("%zu\\n", sizeof({c_name}));')
        expected.append(ctypes.sizeof(ours))
        for name, *_ in ours._fields_:
            lines.append(f'printf("%zu\\n", offsetof({c_name}, {name}));')
            expected.append(getattr(ours, name).offset)
    constants = {
        "NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO": nvimgcodec_c._INSTANCE_CREATE_INFO,
        "NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS": nvimgcodec_c._DECODE_PARAMS,
        "NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION": nvimgcodec_c._ORIENTATION,
        "NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO": nvimgcodec_c._IMAGE_INFO,
        "NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO": nvimgcodec_c._IMAGE_PLANE_INFO,
        "NVIMGCODEC_STRUCTURE_TYPE_BACKEND": nvimgcodec_c._BACKEND,
        "NVIMGCODEC_STRUCTURE_TYPE_BACKEND_PARAMS": nvimgcodec_c._BACKEND_PARAMS,
        "NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS": nvimgcodec_c._EXECUTION_PARAMS,
        "NVIMGCODEC_BACKEND_KIND_CPU_ONLY": nvimgcodec_c._CPU_ONLY,
        "NVIMGCODEC_BACKEND_KIND_GPU_ONLY": nvimgcodec_c._GPU_ONLY,
        "NVIMGCODEC_BACKEND_KIND_HW_GPU_ONLY": nvimgcodec_c._HW_GPU_ONLY,
        "NVIMGCODEC_DEVICE_CPU_ONLY": nvimgcodec_c._DEVICE_CPU_ONLY,
        "NVIMGCODEC_COLORSPEC_SRGB": nvimgcodec_c._COLORSPEC_SRGB,
        "NVIMGCODEC_COLORSPEC_GRAY": nvimgcodec_c._COLORSPEC_GRAY,
        "NVIMGCODEC_COLORSPEC_SYCC": nvimgcodec_c._COLORSPEC_SYCC,
        "NVIMGCODEC_SAMPLEFORMAT_P_Y": nvimgcodec_c._SAMPLEFORMAT_P_Y,
        "NVIMGCODEC_SAMPLEFORMAT_I_RGB": nvimgcodec_c._SAMPLEFORMAT_I_RGB,
        "NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8": nvimgcodec_c._UINT8,
        "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE": nvimgcodec_c._BUFFER_DEVICE,
        "NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST": nvimgcodec_c._BUFFER_HOST,
        "NVIMGCODEC_PROCESSING_STATUS_SUCCESS": nvimgcodec_c._PROCESSING_SUCCESS,
        "NVIMGCODEC_LOAD_HINT_POLICY_FIXED": nvimgcodec_c._LOAD_HINT_FIXED,
        "NVIMGCODEC_BACKEND_KIND_HYBRID_CPU_GPU": nvimgcodec_c._HYBRID_CPU_GPU,
        "NVIMGCODEC_STRUCTURE_TYPE_ENCODE_PARAMS": encode_c._ENCODE_PARAMS,
        "NVIMGCODEC_STRUCTURE_TYPE_JPEG_ENCODE_PARAMS": encode_c._JPEG_ENCODE_PARAMS,
        "NVIMGCODEC_QUALITY_TYPE_QUALITY": encode_c._QUALITY_TYPE_QUALITY,
        "NVIMGCODEC_SAMPLING_444": encode_c._SAMPLING_444,
        "NVIMGCODEC_SAMPLING_420": encode_c._SAMPLING_420,
        "NVIMGCODEC_SAMPLING_GRAY": encode_c._SAMPLING_GRAY,
    }
    for name, value in constants.items():
        lines.append(f'printf("%lld\\n", (long long){name});')
        expected.append(value)
    source = tmp_path / "layout.c"
    source.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "nvimgcodec.h"\n'
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    binary = tmp_path / "layout"
    build = subprocess.run(
        [compiler, f"-I{tmp_path}", f"-I{header.parent}", str(source), "-o", str(binary)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    printed = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    assert [int(v) for v in printed.stdout.split()] == expected


def test_every_processing_status_of_the_header_has_a_name():
    """A GPU decode failure's reason names the status (as the header's enumerator says it),
    not only its number: every value the wheel's header defines is in the table."""
    header = Path(nvimgcodec_c.package_dir() or "", "include", "nvimgcodec.h")
    if not header.exists():
        pytest.skip("no nvimgcodec.h")
    found = re.findall(
        r"NVIMGCODEC_PROCESSING_STATUS_(\w+)\s*=\s*(0x[0-9a-fA-F]+)", header.read_text()
    )
    assert len(found) > 15, found  # the pattern still reads the header
    values = {name: int(value, 16) for name, value in found if name != "SUCCESS"}
    unnamed = {n: hex(v) for n, v in values.items() if v not in nvimgcodec_c._PROCESSING_NAMES}
    assert not unnamed
    assert nvimgcodec_c.processing_status_name(0x2001) == "tiling unsupported (0x2001)"
    assert nvimgcodec_c.processing_status_name(0x4001) == "status (0x4001)"


def test_every_call_status_of_the_header_has_a_name():
    header = Path(nvimgcodec_c.package_dir() or "", "include", "nvimgcodec.h")
    if not header.exists():
        pytest.skip("no nvimgcodec.h")
    found = dict(re.findall(r"NVIMGCODEC_STATUS_(\w+)\s*=\s*(\d+),", header.read_text()))
    assert len(found) > 15 and found.pop("SUCCESS") == "0", found
    for name, value in found.items():  # the header's words, in lower case, begin ours
        ours = nvimgcodec_c._STATUS_NAMES[int(value)].replace(" ", "_").replace("-", "_")
        assert ours.upper().startswith(name.replace("CODESTREAM", "CODE_STREAM")), (name, ours)
    error = nvimgcodec_c.NvImgCodecError("nvimgcodecDecoderCreate", 7)
    assert str(error).startswith("nvimgcodecDecoderCreate failed with nvImageCodec status 7 (arch")
    assert str(nvimgcodec_c.NvImgCodecError("x", 99)) == "x failed with nvImageCodec status 99"


def test_accept_agrees_with_the_python_module(tmp_path: Path, decoder):
    python = gpu_decode.BatchDecoder(cpu_backend=True)
    files = {p.name: p.read_bytes() for p in JPEGS} | _odd_files(tmp_path)
    accepted = set()
    for name, data in files.items():
        ours, theirs = decoder.accept(data, 1 << 28), python.accept(data, 1 << 28)
        assert (ours is None) == (theirs is None), name
        if ours is not None:
            accepted.add(name)
            assert (ours.gray, ours.nbytes) == (theirs.gray, theirs.nbytes), name
    assert accepted == {p.name for p in JPEGS} | {f"exif{o}.jpg" for o in range(1, 9)}
    photo = (SAMPLES / "flower_progressive_3mp.jpg").read_bytes()
    assert decoder.accept(photo, 1000) is None  # over the pixel limit: OpenCV says why


def test_decodes_like_opencv_with_exif_orientation(tmp_path: Path, decoder):
    files = {p.name: p.read_bytes() for p in JPEGS} | _odd_files(tmp_path)
    candidates = {n: decoder.accept(d, 1 << 28) for n, d in files.items()}
    names = [n for n, c in candidates.items() if c is not None]
    decoded = decoder.decode([candidates[n] for n in names])
    assert len(decoded) == len(names)
    for name, image in zip(names, decoded, strict=True):
        gray = candidates[name].gray
        expected = _opencv(files[name], gray)
        assert image is not None, name
        got = image[..., 0] if gray else image[..., ::-1]  # RGB -> OpenCV's BGR
        assert got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_a_corrupt_file_in_a_batch_fails_alone(decoder):
    good = (SAMPLES / "rocket_baseline_rgb.jpg").read_bytes()
    # whole in structure (headers, scan, end marker) but garbage entropy-coded data
    start = good.index(b"\xff\xda")
    length = int.from_bytes(good[start + 2 : start + 4], "big")
    scan = start + 2 + length
    bad = good[:scan] + bytes([0xFF, 0x00] * ((len(good) - 2 - scan) // 2)) + b"\xff\xd9"
    candidates = [decoder.accept(good, 1 << 28), decoder.accept(bad, 1 << 28)]
    if candidates[1] is None:
        pytest.skip("the corrupt stand-in is refused before decoding")
    out = decoder.decode(candidates)
    assert out[0] is not None
    np.testing.assert_array_equal(out[0][..., ::-1], _opencv(good, False))
    assert decoder.last_failures[0] is None
    assert (out[1] is None) == (decoder.last_failures[1] is not None)


def test_colour_and_gray_images_are_decoded_in_separate_calls(monkeypatch, decoder):
    """nvJPEG's hardware decoder fails a whole batch that mixes output formats, so a mixed
    batch becomes one call per kind, and the results keep the batch's order."""
    files = [p.read_bytes() for p in JPEGS]
    candidates = [c for c in (decoder.accept(d, 1 << 28) for d in files) if c is not None]
    mixed = sorted(candidates, key=lambda c: c.gray)[::-1]  # gray first, then colour
    mixed = mixed[1:] + mixed[:1]
    assert {c.gray for c in mixed} == {False, True}
    alone = [decoder.decode([c])[0] for c in mixed]
    calls: list[int] = []
    submit = decoder._submit

    def counting(streams, images, count):
        calls.append(count)
        return submit(streams, images, count)

    monkeypatch.setattr(decoder, "_submit", counting)
    together = decoder.decode(mixed)
    grays = sum(c.gray for c in mixed)
    assert sorted(calls) == sorted([grays, len(mixed) - grays])
    assert decoder.last_failures == [None] * len(mixed)
    for one, other in zip(alone, together, strict=True):
        np.testing.assert_array_equal(one, other)


def test_batches_submitted_ahead_decode_as_one_at_a_time(decoder):
    """submit() queues a batch and returns; a second batch may be submitted before the first
    one's result is taken, and each result is what decode() gives for that batch alone."""
    files = [p.read_bytes() for p in JPEGS]
    candidates = [c for c in (decoder.accept(d, 1 << 28) for d in files) if c is not None]
    first, second = candidates[::2], candidates[1::2]
    assert first and second
    alone = [decoder.decode(first), decoder.decode(second)]
    pending = [decoder.submit(first), decoder.submit(second)]
    together = [p.result() for p in pending]
    for one, other in zip(alone, together, strict=True):
        assert len(one) == len(other)
        for a, b in zip(one, other, strict=True):
            np.testing.assert_array_equal(a, b)
    assert pending[1].failures == [None] * len(second)


def test_an_abandoned_or_failed_batch_frees_every_image(monkeypatch):
    """A submitted batch that is abandoned, or whose gray call fails when its result is
    taken, gives back the memory of all its images (colour and gray)."""
    decoder = nvimgcodec_c.CDecoder(cpu_backend=True, threads=1)
    files = [p.read_bytes() for p in JPEGS]
    mixed = [c for c in (decoder.accept(d, 1 << 28) for d in files) if c is not None]
    assert {c.gray for c in mixed} == {False, True}
    freed: list[int] = []
    memory: list[np.ndarray] = []  # host memory the CPU backend writes, kept alive here

    def output(candidate):
        memory.append(np.empty((candidate.height, candidate.width, 3), np.uint8))
        return SimpleNamespace(owned=True, ptr=id(candidate)), memory[-1].ctypes.data

    monkeypatch.setattr(decoder, "_output", output)
    decoder.use_memory(lambda n: 0, freed.append)
    decoder.submit(mixed).abandon()
    assert sorted(freed) == sorted(id(c) for c in mixed)
    freed.clear()
    finish = decoder._finish_alike

    def gray_fails(part):
        if len(part.outputs) == sum(c.gray for c in mixed):
            decoder._abandon(part)
            raise RuntimeError("the gray call failed")
        return finish(part)

    monkeypatch.setattr(decoder, "_finish_alike", gray_fails)
    with pytest.raises(RuntimeError, match="gray call"):
        decoder.submit(mixed).result()
    assert sorted(freed) == sorted(id(c) for c in mixed)
    decoder.close()


def test_the_decoder_starts_and_decodes_without_holding_the_gil():
    """A pure-Python thread keeps running while the instance starts and while a batch decodes
    (the Python module's import holds the GIL for its whole start)."""

    def start_and_decode() -> None:
        fresh = nvimgcodec_c.CDecoder(cpu_backend=True, threads=1)
        data = (SAMPLES / "flower_progressive_3mp.jpg").read_bytes()
        batch = [fresh.accept(data, 1 << 28) for _ in range(16)]  # ~0.3 s of decoding
        fresh.decode(batch)

    ticks, _, took = ticks_while(start_and_decode)
    assert ticks >= 10, (ticks, took)


_HOLD_PROBE = """
import ctypes, hashlib, json, sys
from pathlib import Path
from imgops.io import nvimgcodec_c as c
lib = c.library()
flags = {n: bool(getattr(lib, n)._flags_ & ctypes._FUNCFLAG_PYTHONAPI) for n in c.QUICK_CALLS}
slow = bool(lib.nvimgcodecDecoderDecode._flags_ & ctypes._FUNCFLAG_PYTHONAPI)
decoder = c.CDecoder(cpu_backend=True, threads=2)
digests = []
for path in sorted(Path(sys.argv[1]).glob("*.jpg")):
    candidate = decoder.accept(path.read_bytes(), 1 << 28)
    if candidate is not None:
        (image,) = decoder.decode([candidate])
        digests.append(hashlib.sha256(image.tobytes()).hexdigest())
print(json.dumps([flags, slow, digests]))
"""


@pytest.mark.parametrize("mode", ["hold", "release"])
def test_quick_calls_keep_the_gil_only_when_asked_and_decode_the_same(mode):
    """IMGOPS_NVIMGCODEC_GIL=hold binds the per-image calls (QUICK_CALLS) through
    ctypes.PyDLL; the decode call and the rest still release the GIL; the pixels are the
    same either way (a fresh process each: the library is bound once per process)."""
    import hashlib
    import json
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _HOLD_PROBE, str(SAMPLES)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "IMGOPS_NVIMGCODEC_GIL": mode},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    flags, slow, digests = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(flags.values()) == {mode == "hold"} and not slow
    expected = []
    for path in JPEGS:
        decoder = nvimgcodec_c.CDecoder(cpu_backend=True, threads=2)
        candidate = decoder.accept(path.read_bytes(), 1 << 28)
        if candidate is not None:
            (image,) = decoder.decode([candidate])
            expected.append(hashlib.sha256(image.tobytes()).hexdigest())
        decoder.close()
    assert digests == expected and len(digests) >= 3


def test_gpu_decoding_without_memory_is_refused():
    fresh = nvimgcodec_c.CDecoder(cpu_backend=True, threads=1)
    fresh.cpu_backend = False  # as on a GPU: outputs must come from use_memory()
    candidate = fresh.accept((SAMPLES / "rocket_baseline_rgb.jpg").read_bytes(), 1 << 28)
    with pytest.raises(RuntimeError, match="use_memory"):
        fresh.decode([candidate])


def test_a_failed_gray_call_gives_the_colour_images_memory_back(monkeypatch):
    """decode() makes one call per kind; when the second one raises, the first one's images
    (which own device memory) are freed before the error goes up."""

    decoder = nvimgcodec_c.CDecoder(cpu_backend=True, threads=1)
    freed: list[int] = []
    decoder.use_memory(lambda n: 0, freed.append)

    def alike(batch, cuda_stream):
        if batch[0].gray:
            raise RuntimeError("the gray call failed")
        outputs = [SimpleNamespace(owned=True, ptr=100 + k) for k in range(len(batch))]
        return nvimgcodec_c._Part(outputs, [None] * len(batch), None)

    monkeypatch.setattr(decoder, "_start_alike", alike)
    batch = [SimpleNamespace(gray=g) for g in (False, True, False)]
    with pytest.raises(RuntimeError, match="gray call"):
        decoder.decode(batch)
    assert sorted(freed) == [100, 101]
    decoder.close()


@pytest.mark.gpu_driver
def test_on_the_gpu_it_decodes_what_the_python_module_decodes(tmp_path: Path):
    """GPU backends (hardware engine, then CUDA): the C API binding gives the Python module's
    pixels exactly, into stream-ordered memory of ours, and stays within 2 levels of OpenCV."""
    from imgops.engine import cuda_driver

    if not cuda_driver.driver_available():
        pytest.skip("the CUDA driver sees no GPU")
    device = cuda_driver.Device(0)
    stream = device.stream()
    ours = nvimgcodec_c.CDecoder(0, threads=4)
    ours.use_memory(lambda n: device.alloc(n, stream), lambda p: device.free(p, stream))
    theirs = gpu_decode.BatchDecoder(0, threads=4)
    try:
        _compare_on_the_gpu(tmp_path, device, stream, ours, theirs)
    finally:
        stream.synchronize()
        theirs = None
        ours.close()
        stream.close()
        device.close()


def _compare_on_the_gpu(tmp_path: Path, device, stream, ours, theirs) -> None:
    files = {p.name: p.read_bytes() for p in JPEGS} | _odd_files(tmp_path)
    names = [n for n in files if ours.accept(files[n], 1 << 28) is not None]
    assert {f"exif{o}.jpg" for o in range(1, 9)} <= set(names)
    decoded = ours.decode([ours.accept(files[n], 1 << 28) for n in names], stream.handle)
    reference = theirs.decode([theirs.accept(files[n], 1 << 28) for n in names], stream.handle)
    stream.synchronize()
    compared = 0
    failures = ours.last_failures
    for name, image, other, why in zip(names, decoded, reference, failures, strict=True):
        # what the GPU backends refuse (the engine sends it to the CPU path) they refuse alike
        assert (image is None) == (other is None), (name, why)
        if image is None:
            continue
        compared += 1
        host = np.empty((image.height, image.width, image.channels), np.uint8)
        device.copy_to_host(host.ctypes.data, image.ptr, host.nbytes, stream)
        face = other.__cuda_array_interface__
        expected = np.empty(face["shape"], np.uint8)
        pitch = face["strides"][0] if face.get("strides") else host.shape[1] * host.shape[2]
        for row in range(expected.shape[0]):
            device.copy_to_host(
                expected[row].ctypes.data, face["data"][0] + row * pitch, expected[row].nbytes,
                stream,
            )  # fmt: skip
        stream.synchronize()
        np.testing.assert_array_equal(host, expected.reshape(host.shape), err_msg=name)
        gray = image.channels == 1
        cpu = _opencv(files[name], gray)
        cpu = cpu[..., None] if gray else cpu[..., ::-1]
        assert np.abs(host.astype(int) - cpu).max() <= 2, name
        ours.release(image)
    assert compared >= len(names) - 2, (compared, names)


def test_the_engine_uses_the_c_api_only_on_versions_it_was_checked_against(monkeypatch):
    from imgops.engine import driver_stage

    assert nvimgcodec_c.verified() == (
        tuple(int(p) for p in nvimgcodec_c.version().split(".")[:2]) in nvimgcodec_c.VERIFIED
    )
    monkeypatch.setattr(nvimgcodec_c, "version", lambda: "0.9.0.20")
    assert isinstance(driver_stage.make_decoder(0, 1, cpu_backend=True), nvimgcodec_c.CDecoder)
    monkeypatch.setenv("IMGOPS_NVIMGCODEC_API", "python")
    assert isinstance(driver_stage.make_decoder(0, 1, cpu_backend=True), gpu_decode.BatchDecoder)
    monkeypatch.delenv("IMGOPS_NVIMGCODEC_API")
    for other in ("0.10.0", "1.0", "unknown", ""):
        monkeypatch.setattr(nvimgcodec_c, "version", lambda other=other: other)
        assert not nvimgcodec_c.verified()
        decoder = driver_stage.make_decoder(0, 1, cpu_backend=True)
        assert isinstance(decoder, gpu_decode.BatchDecoder), other


def test_accept_from_many_threads_at_once(tmp_path: Path, decoder):
    """The prep threads parse files concurrently (ctypes lets them: no GIL between them): the
    same answers as one thread, and code streams created and destroyed across threads."""
    from concurrent.futures import ThreadPoolExecutor

    files = {p.name: p.read_bytes() for p in JPEGS} | _odd_files(tmp_path)
    names = sorted(files) * 25

    def answer(name: str) -> tuple[str, object]:
        found = decoder.accept(files[name], 1 << 28)
        return name, None if found is None else (found.width, found.height, found.gray)

    alone = dict(answer(name) for name in sorted(files))
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(answer, names))
    assert all(alone[name] == got for name, got in together)
    batch = [decoder.accept(files[name], 1 << 28) for name in sorted(files) if alone[name]]
    assert all(image is not None for image in decoder.decode(batch))


def test_the_gpu_decoder_loads_the_extensions_it_is_told(monkeypatch, tmp_path):
    """IMGOPS_NVIMGCODEC_EXTENSIONS picks the extensions a GPU decoder's instance loads, through
    a temporary folder of links that is removed once the instance has loaded them."""
    from imgops.io import nvimgcodec_c as c

    monkeypatch.delenv("IMGOPS_NVIMGCODEC_EXTENSIONS", raising=False)
    assert c.gpu_extensions() is None  # every installed extension
    monkeypatch.setenv("IMGOPS_NVIMGCODEC_EXTENSIONS", " nvjpeg, jpeg_turbo ")
    assert c.gpu_extensions() == ("nvjpeg", "jpeg_turbo")
    monkeypatch.setenv("IMGOPS_NVIMGCODEC_EXTENSIONS", "all")
    assert c.gpu_extensions() is None
    real = tmp_path / "extensions"
    real.mkdir()
    for name in ("libnvjpeg_ext.so.0.9.0", "libnvjpeg2k_ext.so.0.9.0", "libopencv_ext.so.0.9.0"):
        (real / name).write_bytes(b"")
    subset = c._extension_subset(str(real), ("nvjpeg",))
    linked = sorted(os.listdir(subset))
    assert linked == ["libnvjpeg_ext.so.0.9.0"]
    assert os.path.realpath(os.path.join(subset, linked[0])) == str(real / linked[0])
    with c._removed_after(subset):
        pass
    assert not os.path.exists(subset)
