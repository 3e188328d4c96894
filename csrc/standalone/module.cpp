// imgops._cli_kernels: the command line's CPU kernels as a plain CPython module, free of torch,
// so that `imgops gray` on the CPU starts in a fraction of a second instead of waiting seconds
// for `import torch`:
// - rgb_to_gray runs the very loops of cpu/gray_span.h that the torch op runs;
// - png_filter_rows runs the PNG row filters of png_filter.h for imgops.io.png;
// - png_encode and png_encode_filtered write whole PNG files with the row deflate of
//   png_deflate.h (png_encode.h);
// - png_deflate_layout and png_finish_zlib serve the GPU's deflate (png_deflate_parallel.h):
//   the device memory it needs, and the PNG file around the zlib stream it makes;
//   png_finish_zlib_to_file frames that stream and writes the file in one call;
//   png_encode_filtered_emulated runs that deflate here, for the tests;
// - device_gray and device_png_tail queue a batch's luma kernels, and its PNG filters, device
//   deflates and copies, through the CUDA driver (device_batch.h): one call for many images,
//   the GIL released.
// One image (or strip) per call on the calling thread, with the GIL released: the command
// line's worker threads run several at once.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../cpu/gray_span.h"
#include "device_batch.h"
#include "file_read.h"
#include "file_write.h"
#include "png_deflate_emulated.h"
#include "png_encode.h"
#include "png_filter.h"

namespace {

template <typename T>
imgops::GraySpanFn<T> span_for(bool bgr, const char* isa) {
  return bgr ? imgops::gray_span_for<T, true>(isa) : imgops::gray_span_for<T, false>(isa);
}

PyObject* rgb_to_gray(PyObject* /*self*/, PyObject* args) {
  Py_buffer src;
  Py_buffer dst;
  int itemsize = 0;
  int bgr = 0;
  const char* isa = "best";
  // y*: any C-contiguous buffer read as bytes; w*: a writable one.
  if (!PyArg_ParseTuple(args, "y*w*ip|s:rgb_to_gray", &src, &dst, &itemsize, &bgr, &isa)) {
    return nullptr;
  }
  const imgops::GraySpanFn<uint8_t> span8 = span_for<uint8_t>(bgr != 0, isa);
  const imgops::GraySpanFn<uint16_t> span16 = span_for<uint16_t>(bgr != 0, isa);
  const char* problem = nullptr;
  if ((itemsize == 1 && span8 == nullptr) || (itemsize == 2 && span16 == nullptr)) {
    problem = "this CPU or item size has no loop for that instruction set";
  } else if (itemsize != 1 && itemsize != 2) {
    problem = "itemsize must be 1 (uint8) or 2 (uint16)";
  } else if (dst.len % itemsize != 0 || src.len != 3 * dst.len) {
    problem = "the input must hold exactly 3 values for every output value";
  } else if (reinterpret_cast<uintptr_t>(src.buf) % itemsize != 0 ||
             reinterpret_cast<uintptr_t>(dst.buf) % itemsize != 0) {
    problem = "buffers must be aligned to the item size";
  } else if (src.buf == dst.buf && dst.len > 0) {
    problem = "input and output must not be the same buffer";
  }
  if (problem == nullptr) {
    const int64_t pixels = dst.len / itemsize;
    Py_BEGIN_ALLOW_THREADS;
    if (itemsize == 1) {
      span8(static_cast<const uint8_t*>(src.buf), static_cast<uint8_t*>(dst.buf), pixels);
    } else {
      span16(static_cast<const uint16_t*>(src.buf), static_cast<uint16_t*>(dst.buf), pixels);
    }
    Py_END_ALLOW_THREADS;
  }
  PyBuffer_Release(&src);
  PyBuffer_Release(&dst);
  if (problem != nullptr) {
    PyErr_SetString(PyExc_ValueError, problem);
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* png_filter_rows(PyObject* /*self*/, PyObject* args) {
  Py_buffer rows;
  Py_buffer out;
  Py_ssize_t count = 0;
  Py_ssize_t row_bytes = 0;
  Py_ssize_t bpp = 0;
  int filter = 0;
  if (!PyArg_ParseTuple(args, "y*w*nnni:png_filter_rows", &rows, &out, &count, &row_bytes, &bpp,
                        &filter)) {
    return nullptr;
  }
  const char* problem = nullptr;
  if (count < 0 || row_bytes < 1 || bpp < 1 || bpp > 8) {
    problem = "count >= 0, row_bytes >= 1 and 1 <= bpp <= 8 are required";
  } else if (filter < imgops::png::kAdaptive || filter > imgops::png::kPaeth) {
    problem = "filter must be -1 (adaptive), 0 (None), 1 (Sub), 2 (Up), 3 (Average) or 4 (Paeth)";
  } else if (rows.len < (count + 1) * row_bytes || out.len < count * (row_bytes + 1)) {
    problem = "rows needs (count + 1) * row_bytes bytes and out count * (row_bytes + 1)";
  }
  if (problem == nullptr) {
    Py_BEGIN_ALLOW_THREADS;
    imgops::png::filter_rows(static_cast<const uint8_t*>(rows.buf), static_cast<uint8_t*>(out.buf),
                             count, row_bytes, bpp, filter);
    Py_END_ALLOW_THREADS;
  }
  PyBuffer_Release(&rows);
  PyBuffer_Release(&out);
  if (problem != nullptr) {
    PyErr_SetString(PyExc_ValueError, problem);
    return nullptr;
  }
  Py_RETURN_NONE;
}

// Checks a shape for png_encode*; nullptr when it is fine, else the problem.
const char* check_png_shape(const imgops::png::ImageShape& shape) {
  if (shape.width < 1 || shape.height < 1 || shape.width > 0x7FFFFFFF ||
      shape.height > 0x7FFFFFFF) {
    return "width and height must be 1..2^31-1";
  }
  if (shape.channels < 1 || shape.channels > 4) return "channels must be 1..4";
  if (shape.itemsize != 1 && shape.itemsize != 2) return "itemsize must be 1 or 2";
  return nullptr;
}

// Checks png_encode*'s pixels, stride and filter for a shape; nullptr when they are fine.
const char* check_png_pixels(const imgops::png::ImageShape& shape, const Py_buffer& pixels,
                             Py_ssize_t row_stride, int filter) {
  const char* problem = check_png_shape(shape);
  if (problem != nullptr) return problem;
  if (filter < imgops::png::kAdaptive || filter > imgops::png::kPaeth) {
    return "filter must be -1..4";
  }
  if (row_stride < shape.row_bytes() ||
      pixels.len < (shape.height - 1) * row_stride + shape.row_bytes()) {
    return "the buffer is smaller than height rows of row_stride bytes";
  }
  if (shape.itemsize == 2 && reinterpret_cast<uintptr_t>(pixels.buf) % 2 != 0) {
    return "16-bit samples must be aligned";
  }
  return nullptr;
}

// Runs encode(out) without the GIL into a new bytes object of max_png_bytes(shape), which
// nothing else can see yet, and trims it to the size encode returns.
template <typename Encode>
PyObject* png_bytes(const imgops::png::ImageShape& shape, Encode&& encode) {
  PyObject* result = PyBytes_FromStringAndSize(
      nullptr, static_cast<Py_ssize_t>(imgops::png::max_png_bytes(shape)));
  if (result == nullptr) return nullptr;
  uint8_t* out = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(result));
  size_t size = 0;
  bool no_memory = false;
  Py_BEGIN_ALLOW_THREADS;
  try {
    size = encode(out);
  } catch (const std::bad_alloc&) {
    no_memory = true;
  }
  Py_END_ALLOW_THREADS;
  if (no_memory) {
    Py_DECREF(result);
    return PyErr_NoMemory();
  }
  if (_PyBytes_Resize(&result, static_cast<Py_ssize_t>(size)) != 0) return nullptr;
  return result;
}

PyObject* png_encode(PyObject* /*self*/, PyObject* args) {
  Py_buffer pixels;
  imgops::png::ImageShape shape{};
  Py_ssize_t width = 0;
  Py_ssize_t height = 0;
  Py_ssize_t row_stride = 0;
  int filter = 0;
  if (!PyArg_ParseTuple(args, "y*nniini:png_encode", &pixels, &width, &height, &shape.channels,
                        &shape.itemsize, &row_stride, &filter)) {
    return nullptr;
  }
  shape.width = width;
  shape.height = height;
  const char* problem = check_png_pixels(shape, pixels, row_stride, filter);
  const auto* data = static_cast<const uint8_t*>(pixels.buf);
  PyObject* result = nullptr;
  if (problem == nullptr) {
    result = png_bytes(shape, [&](uint8_t* out) {
      return imgops::png::encode_image(shape, data, row_stride, filter, out);
    });
  }
  PyBuffer_Release(&pixels);
  if (problem != nullptr) PyErr_SetString(PyExc_ValueError, problem);
  return result;
}

// A file path argument as bytes (PyUnicode_FSConverter), kept with the object it came from.
struct PathArg {
  PyObject* given = nullptr;  // borrowed: the caller's str/bytes/PathLike
  PyObject* encoded = nullptr;  // owned: bytes
  ~PathArg() { Py_XDECREF(encoded); }
  const char* c_str() const { return PyBytes_AS_STRING(encoded); }
};

int convert_path(PyObject* object, void* address) {
  auto* path = static_cast<PathArg*>(address);
  path->given = object;
  return PyUnicode_FSConverter(object, &path->encoded) ? 1 : 0;
}

// OSError (its subclass by errno: FileExistsError for EEXIST, ...) naming the path it was
// about; nullptr for the Python caller to return.
PyObject* raise_write_error(const imgops::files::WriteError& error, const PathArg& temp,
                            const PathArg& target) {
  errno = error.code;
  PyObject* name = error.about == imgops::files::About::kTemporary ? temp.given : target.given;
  return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
}

PyObject* write_file_atomic(PyObject* /*self*/, PyObject* args) {
  Py_buffer data;
  PathArg temp;
  PathArg target;
  int overwrite = 0;
  int durable = 1;
  if (!PyArg_ParseTuple(args, "y*O&O&pp:write_file_atomic", &data, convert_path, &temp,
                        convert_path, &target, &overwrite, &durable)) {
    return nullptr;
  }
  imgops::files::WriteError error;
  const std::string temp_path = temp.c_str();
  const std::string target_path = target.c_str();
  Py_BEGIN_ALLOW_THREADS;
  error = imgops::files::write_file_atomic(static_cast<const uint8_t*>(data.buf),
                                           static_cast<size_t>(data.len), temp_path,
                                           target_path, overwrite != 0, durable != 0);
  Py_END_ALLOW_THREADS;
  const Py_ssize_t size = data.len;
  PyBuffer_Release(&data);
  if (error.code != 0) return raise_write_error(error, temp, target);
  return PyLong_FromSsize_t(size);
}

// read_file(path, limit) -> bytes, or a tuple saying why not, for the caller to word:
// ("not regular", st_mode), ("too large", size), ("shrank", got, size), ("grew", size).
// OSError (naming path) for a failed open, fstat or read.
PyObject* read_file(PyObject* /*self*/, PyObject* args) {
  PathArg path;
  unsigned long long limit = 0;
  if (!PyArg_ParseTuple(args, "O&K:read_file", convert_path, &path, &limit)) return nullptr;
  imgops::files::Opened opened;
  Py_BEGIN_ALLOW_THREADS;
  opened = imgops::files::open_input(path.c_str());
  Py_END_ALLOW_THREADS;
  if (opened.fd < 0) {
    errno = opened.error;
    return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path.given);
  }
  const int fd = opened.fd;
  if (!S_ISREG(opened.mode) || opened.size > limit ||
      opened.size > static_cast<uint64_t>(PY_SSIZE_T_MAX)) {
    ::close(fd);
    if (!S_ISREG(opened.mode)) {
      return Py_BuildValue("(sk)", "not regular", static_cast<unsigned long>(opened.mode));
    }
    return Py_BuildValue("(sK)", "too large", static_cast<unsigned long long>(opened.size));
  }
  PyObject* data = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(opened.size));
  if (data == nullptr) {
    ::close(fd);
    return nullptr;
  }
  auto* out = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(data));
  uint64_t done = 0;
  int error = 0;
  imgops::files::ReadOutcome outcome;
  Py_BEGIN_ALLOW_THREADS;
  outcome = imgops::files::read_opened(fd, out, opened.size, &done, &error);
  Py_END_ALLOW_THREADS;
  using imgops::files::ReadOutcome;
  if (outcome == ReadOutcome::kRead) return data;
  Py_DECREF(data);
  const auto size = static_cast<unsigned long long>(opened.size);
  if (outcome == ReadOutcome::kShrank) {
    return Py_BuildValue("(sKK)", "shrank", static_cast<unsigned long long>(done), size);
  }
  if (outcome == ReadOutcome::kGrew) return Py_BuildValue("(sK)", "grew", size);
  errno = error;
  return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path.given);
}

PyObject* fsync_count(PyObject* /*self*/, PyObject* /*args*/) {
  return PyLong_FromUnsignedLongLong(imgops::files::fsync_calls.load());
}

// The calling thread's reused output buffer for png_encode_to_file: pages written once stay
// mapped, so a batch does not pay the kernel's zeroing of fresh pages for every file. Images
// whose file may exceed kKeptScratchBytes get a buffer of their own, freed after the call
// (memory stays bounded: threads x kKeptScratchBytes at most).
constexpr size_t kKeptScratchBytes = size_t{64} << 20;

uint8_t* scratch_buffer(size_t bytes, std::unique_ptr<uint8_t[]>& once) {
  thread_local std::unique_ptr<uint8_t[]> kept;
  thread_local size_t kept_bytes = 0;
  if (bytes > kKeptScratchBytes) {
    once.reset(new uint8_t[bytes]);
    return once.get();
  }
  if (kept_bytes < bytes) {
    kept.reset();
    kept_bytes = 0;
    kept.reset(new uint8_t[bytes]);
    kept_bytes = bytes;
  }
  return kept.get();
}

// What the native writers report: the file's size, the seconds spent making its bytes and
// writing them, and the write's error (code 0: none).
struct TimedWrite {
  size_t size = 0;
  double make_seconds = 0.0;
  double write_seconds = 0.0;
  imgops::files::WriteError error;
};

// make() returns the file's bytes (a pointer and a count; count 0: nothing is written), which
// are then written as write_file_atomic writes. Call with the GIL released.
template <class Make>
TimedWrite make_and_write(Make make, const std::string& temp, const std::string& target,
                          bool overwrite, bool durable) {
  using Clock = std::chrono::steady_clock;
  TimedWrite done;
  const auto start = Clock::now();
  const auto [bytes, size] = make();
  const auto made = Clock::now();
  done.make_seconds = std::chrono::duration<double>(made - start).count();
  if (size == 0) return done;
  done.error = imgops::files::write_file_atomic(bytes, size, temp, target, overwrite, durable);
  done.size = size;
  done.write_seconds = std::chrono::duration<double>(Clock::now() - made).count();
  return done;
}

// (bytes, make seconds, write seconds), or the write's error as OSError.
PyObject* timed_write_result(const TimedWrite& done, const PathArg& temp, const PathArg& target) {
  if (done.error.code != 0) return raise_write_error(done.error, temp, target);
  return Py_BuildValue("(ndd)", static_cast<Py_ssize_t>(done.size), done.make_seconds,
                       done.write_seconds);
}

PyObject* png_encode_to_file(PyObject* /*self*/, PyObject* args) {
  Py_buffer pixels;
  imgops::png::ImageShape shape{};
  Py_ssize_t width = 0;
  Py_ssize_t height = 0;
  Py_ssize_t row_stride = 0;
  int filter = 0;
  PathArg temp;
  PathArg target;
  int overwrite = 0;
  int durable = 1;
  if (!PyArg_ParseTuple(args, "y*nniiniO&O&pp:png_encode_to_file", &pixels, &width, &height,
                        &shape.channels, &shape.itemsize, &row_stride, &filter, convert_path,
                        &temp, convert_path, &target, &overwrite, &durable)) {
    return nullptr;
  }
  shape.width = width;
  shape.height = height;
  const char* problem = check_png_pixels(shape, pixels, row_stride, filter);
  if (problem != nullptr) {
    PyBuffer_Release(&pixels);
    PyErr_SetString(PyExc_ValueError, problem);
    return nullptr;
  }
  const auto* data = static_cast<const uint8_t*>(pixels.buf);
  const std::string temp_path = temp.c_str();
  const std::string target_path = target.c_str();
  TimedWrite done;
  bool no_memory = false;
  Py_BEGIN_ALLOW_THREADS;
  try {
    std::unique_ptr<uint8_t[]> once;
    auto encode = [&]() {
      uint8_t* out = scratch_buffer(imgops::png::max_png_bytes(shape), once);
      const size_t size = imgops::png::encode_image(shape, data, row_stride, filter, out);
      return std::pair<const uint8_t*, size_t>(out, size);
    };
    done = make_and_write(encode, temp_path, target_path, overwrite != 0, durable != 0);
  } catch (const std::bad_alloc&) {
    no_memory = true;
  }
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&pixels);
  if (no_memory) return PyErr_NoMemory();
  return timed_write_result(done, temp, target);
}

// The arguments (rows, width, height, channels, itemsize) of the encoders of filtered rows, and
// the PNG file that encode(shape, rows, out) writes; RuntimeError with the message of a
// std::logic_error it throws (the emulated GPU deflate's checks).
template <typename Encode>
PyObject* encode_filtered_rows(PyObject* args, const char* format, Encode&& encode) {
  Py_buffer rows;
  imgops::png::ImageShape shape{};
  Py_ssize_t width = 0;
  Py_ssize_t height = 0;
  if (!PyArg_ParseTuple(args, format, &rows, &width, &height, &shape.channels,
                        &shape.itemsize)) {
    return nullptr;
  }
  shape.width = width;
  shape.height = height;
  const char* problem = check_png_shape(shape);
  if (problem == nullptr && rows.len != shape.height * (shape.row_bytes() + 1)) {
    problem = "rows must hold exactly height * (1 + row bytes) bytes";
  }
  const auto* data = static_cast<const uint8_t*>(rows.buf);
  PyObject* result = nullptr;
  std::string broken;
  if (problem == nullptr) {
    result = png_bytes(shape, [&](uint8_t* out) -> size_t {
      try {
        return encode(shape, data, out);
      } catch (const std::logic_error& error) {
        broken = error.what();
        return 0;
      }
    });
  }
  PyBuffer_Release(&rows);
  if (problem != nullptr) PyErr_SetString(PyExc_ValueError, problem);
  if (result != nullptr && !broken.empty()) {
    Py_DECREF(result);
    PyErr_SetString(PyExc_RuntimeError, broken.c_str());
    return nullptr;
  }
  return result;
}

PyObject* png_encode_filtered(PyObject* /*self*/, PyObject* args) {
  return encode_filtered_rows(args, "y*nnii:png_encode_filtered", imgops::png::encode_filtered);
}

PyObject* png_encode_filtered_emulated(PyObject* /*self*/, PyObject* args) {
  return encode_filtered_rows(args, "y*nnii:png_encode_filtered_emulated",
                              imgops::png::encode_filtered_emulated);
}

PyObject* png_deflate_layout(PyObject* /*self*/, PyObject* args) {
  long long row = 0;
  long long height = 0;
  if (!PyArg_ParseTuple(args, "LL:png_deflate_layout", &row, &height)) return nullptr;
  if (row < 1 || height < 1) {
    PyErr_SetString(PyExc_ValueError, "row and height must be positive");
    return nullptr;
  }
  const imgops::png::parallel::Layout l = imgops::png::parallel::layout(row, height);
  return Py_BuildValue("(LLLLL)", static_cast<long long>(l.total), static_cast<long long>(l.out),
                       static_cast<long long>(l.out_bytes), static_cast<long long>(l.size),
                       static_cast<long long>(l.g.blocks));
}

PyObject* png_file_room(PyObject* /*self*/, PyObject* args) {
  long long zlib = 0;
  if (!PyArg_ParseTuple(args, "L:png_file_room", &zlib)) return nullptr;
  if (zlib < 0) {
    PyErr_SetString(PyExc_ValueError, "zlib bytes must not be negative");
    return nullptr;
  }
  return PyLong_FromSize_t(imgops::png::png_file_bytes(static_cast<size_t>(zlib)));
}

PyObject* png_finish_zlib(PyObject* /*self*/, PyObject* args) {
  Py_buffer buffer;
  imgops::png::ImageShape shape{};
  Py_ssize_t zlib = 0;
  Py_ssize_t width = 0;
  Py_ssize_t height = 0;
  if (!PyArg_ParseTuple(args, "w*nnnii:png_finish_zlib", &buffer, &zlib, &width, &height,
                        &shape.channels, &shape.itemsize)) {
    return nullptr;
  }
  shape.width = width;
  shape.height = height;
  const char* problem = check_png_shape(shape);
  const size_t need = imgops::png::png_file_bytes(static_cast<size_t>(zlib));
  if (problem == nullptr && (zlib < 6 || static_cast<size_t>(buffer.len) < need)) {
    problem = "the buffer cannot hold the PNG file around that zlib stream";
  }
  size_t size = 0;
  if (problem == nullptr) {
    auto* out = static_cast<uint8_t*>(buffer.buf);
    Py_BEGIN_ALLOW_THREADS;
    size = imgops::png::finish_png_file(shape, static_cast<size_t>(zlib), out);
    Py_END_ALLOW_THREADS;
  }
  PyBuffer_Release(&buffer);
  if (problem != nullptr) {
    PyErr_SetString(PyExc_ValueError, problem);
    return nullptr;
  }
  return PyLong_FromSize_t(size);
}

// The stream's length as the device path leaves it: 8 bytes, little-endian, at `at`.
uint64_t load_le64(const uint8_t* at) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | at[i];
  return value;
}

PyObject* png_finish_zlib_to_file(PyObject* /*self*/, PyObject* args) {
  Py_buffer buffer;
  imgops::png::ImageShape shape{};
  Py_ssize_t room = 0;
  Py_ssize_t out_bytes = 0;
  Py_ssize_t width = 0;
  Py_ssize_t height = 0;
  PathArg temp;
  PathArg target;
  int overwrite = 0;
  int durable = 1;
  if (!PyArg_ParseTuple(args, "w*nnnniiO&O&pp:png_finish_zlib_to_file", &buffer, &room,
                        &out_bytes, &width, &height, &shape.channels, &shape.itemsize,
                        convert_path, &temp, convert_path, &target, &overwrite, &durable)) {
    return nullptr;
  }
  shape.width = width;
  shape.height = height;
  const char* problem = check_png_shape(shape);
  if (problem == nullptr &&
      (room < 0 || out_bytes < 6 || static_cast<size_t>(buffer.len) < static_cast<size_t>(room) + 8 ||
       static_cast<size_t>(room) < imgops::png::png_file_bytes(static_cast<size_t>(out_bytes)))) {
    problem = "the buffer cannot hold the PNG file of a zlib stream of out_bytes and its length";
  }
  if (problem != nullptr) {
    PyBuffer_Release(&buffer);
    PyErr_SetString(PyExc_ValueError, problem);
    return nullptr;
  }
  auto* out = static_cast<uint8_t*>(buffer.buf);
  const std::string temp_path = temp.c_str();
  const std::string target_path = target.c_str();
  uint64_t zlib = 0;
  TimedWrite done;
  Py_BEGIN_ALLOW_THREADS;
  auto frame = [&]() {
    zlib = load_le64(out + room);
    size_t size = 0;  // (a length the device deflate cannot give: nothing is written)
    if (zlib >= 6 && zlib <= static_cast<uint64_t>(out_bytes)) {
      size = imgops::png::finish_png_file(shape, static_cast<size_t>(zlib), out);
    }
    return std::pair<const uint8_t*, size_t>(out, size);
  };
  done = make_and_write(frame, temp_path, target_path, overwrite != 0, durable != 0);
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&buffer);
  if (done.size == 0) {
    PyErr_Format(PyExc_RuntimeError, "the device deflate gave a stream of %llu bytes",
                 static_cast<unsigned long long>(zlib));
    return nullptr;
  }
  return timed_write_result(done, temp, target);
}

// The int64 values of a C-contiguous buffer (the engine passes numpy int64 arrays), or nullptr
// with ValueError when its size is not a multiple of `group` values.
const int64_t* int64_values(const Py_buffer& buffer, size_t group, size_t* count,
                            const char* name) {
  if (buffer.len % static_cast<Py_ssize_t>(8 * group) != 0) {
    PyErr_Format(PyExc_ValueError, "%s must hold a multiple of %zu int64 values", name, group);
    return nullptr;
  }
  *count = static_cast<size_t>(buffer.len) / (8 * group);
  return static_cast<const int64_t*>(buffer.buf);
}

template <typename T>
T from_int64(int64_t value) {
  return reinterpret_cast<T>(static_cast<uintptr_t>(value));
}

// The driver table (imgops.engine.native_batch: 7 driver functions, 7 kernels, the SM count),
// or false with ValueError where an entry is missing.
bool driver_from_table(const int64_t* t, imgops::device::Driver* d) {
  for (int k = 0; k < imgops::device::kTableEntries - 1; ++k) {
    if (t[k] == 0) {
      PyErr_SetString(PyExc_ValueError, "the device table misses a driver function or kernel");
      return false;
    }
  }
  d->alloc = from_int64<imgops::device::MemAllocAsync>(t[0]);
  d->free = from_int64<imgops::device::MemFreeAsync>(t[1]);
  d->launch = from_int64<imgops::device::LaunchKernel>(t[2]);
  d->memset = from_int64<imgops::device::MemsetD8Async>(t[3]);
  d->copy_to_host = from_int64<imgops::device::MemcpyDtoHAsync>(t[4]);
  d->record = from_int64<imgops::device::EventRecord>(t[5]);
  d->wait = from_int64<imgops::device::StreamWaitEvent>(t[6]);
  d->gray = from_int64<void*>(t[7]);
  d->png_filter = from_int64<void*>(t[8]);
  for (int k = 0; k < 5; ++k) d->deflate[k] = from_int64<void*>(t[9 + k]);
  d->multiprocessors = t[14] > 0 ? t[14] : 1;
  return true;
}

// (code, call, owned) of a queue_* call, as device_png_tail and device_gray return it.
PyObject* outcome_tuple(const imgops::device::Outcome& done) {
  PyObject* owned = PyList_New(static_cast<Py_ssize_t>(done.owned.size()));
  if (owned == nullptr) return nullptr;
  for (size_t i = 0; i < done.owned.size(); ++i) {
    PyObject* ptr = PyLong_FromUnsignedLongLong(done.owned[i]);
    if (ptr == nullptr) {
      Py_DECREF(owned);
      return nullptr;
    }
    PyList_SET_ITEM(owned, static_cast<Py_ssize_t>(i), ptr);
  }
  return Py_BuildValue("(isN)", done.code, done.call, owned);
}

// The (table, values, stream) arguments of device_gray and device_free, parsed and checked:
// the driver from the table, `count` groups of `group` int64 values, a stream. ok() is false,
// with a Python error set, where any of them is unusable; the buffers are released with it.
class TableArguments {
 public:
  TableArguments(PyObject* args, const char* name, size_t group, const char* values_name) {
    const std::string format = std::string("y*y*K:") + name;  // (the name in TypeErrors)
    if (!PyArg_ParseTuple(args, format.c_str(), &table_, &values_, &stream)) return;
    parsed_ = true;
    size_t entries = 0;
    const int64_t* t = int64_values(table_, 1, &entries, "table");
    values = int64_values(values_, group, &count, values_name);
    if (t == nullptr || values == nullptr) return;
    if (entries != imgops::device::kTableEntries || stream == 0) {
      PyErr_Format(PyExc_ValueError, "%s needs the 15-entry table and a stream", name);
      return;
    }
    ok_ = driver_from_table(t, &driver);
  }
  ~TableArguments() {
    if (parsed_) {
      PyBuffer_Release(&table_);
      PyBuffer_Release(&values_);
    }
  }
  TableArguments(const TableArguments&) = delete;
  TableArguments& operator=(const TableArguments&) = delete;

  bool ok() const { return ok_; }

  imgops::device::Driver driver;
  const int64_t* values = nullptr;
  size_t count = 0;
  unsigned long long stream = 0;

 private:
  Py_buffer table_{};
  Py_buffer values_{};
  bool parsed_ = false;
  bool ok_ = false;
};

PyObject* device_gray(PyObject* /*self*/, PyObject* args) {
  TableArguments a(args, "device_gray", imgops::device::kColourFields, "images");
  if (!a.ok()) return nullptr;
  const int64_t* raw = a.values;
  const size_t count = a.count;
  std::vector<imgops::device::ColourImage> list(count);
  for (size_t i = 0; i < count; ++i) {
    const int64_t* f = raw + i * imgops::device::kColourFields;
    imgops::device::ColourImage& image = list[i];
    image.src = static_cast<uint64_t>(f[0]);
    image.pitch = f[1];
    image.width = f[2];
    image.height = f[3];
    image.bgr = f[4];
    if (image.width < 0 || image.height < 0 || image.width > (int64_t{1} << 40) ||
        image.pitch < 3 * image.width || (image.src == 0 && image.width * image.height > 0)) {
      PyErr_Format(PyExc_ValueError, "device_gray: image %zu is not a valid colour image", i);
      return nullptr;
    }
  }
  imgops::device::Outcome done;
  Py_BEGIN_ALLOW_THREADS;
  done = imgops::device::queue_gray(a.driver, list.data(), count,
                                    reinterpret_cast<void*>(a.stream));
  Py_END_ALLOW_THREADS;
  return outcome_tuple(done);
}

PyObject* device_png_tail(PyObject* /*self*/, PyObject* args) {
  Py_buffer table;
  Py_buffer images;
  Py_buffer streams;
  int filter = 0;
  unsigned long long event = 0;
  Py_ssize_t first = 0;
  int join = 1;
  if (!PyArg_ParseTuple(args, "y*y*iy*Knp:device_png_tail", &table, &images, &filter, &streams,
                        &event, &first, &join)) {
    return nullptr;
  }
  struct Release {
    Py_buffer* buffers[3];
    ~Release() {
      for (Py_buffer* b : buffers) PyBuffer_Release(b);
    }
  } release{{&table, &images, &streams}};
  size_t entries = 0, count = 0, stream_count = 0;
  const int64_t* t = int64_values(table, 1, &entries, "table");
  const int64_t* raw = int64_values(images, imgops::device::kImageFields, &count, "images");
  const int64_t* s = int64_values(streams, 1, &stream_count, "streams");
  if (t == nullptr || raw == nullptr || s == nullptr) return nullptr;
  if (entries != imgops::device::kTableEntries || stream_count < 1 || event == 0) {
    PyErr_SetString(PyExc_ValueError,
                    "device_png_tail needs the 15-entry table, a stream and an event");
    return nullptr;
  }
  if (filter < -1 || filter > 4 || first < 0) {
    PyErr_SetString(PyExc_ValueError, "filter must be -1..4 and first not negative");
    return nullptr;
  }
  imgops::device::Driver d;
  if (!driver_from_table(t, &d)) return nullptr;
  std::vector<imgops::device::Image> list(count);
  for (size_t i = 0; i < count; ++i) {
    const int64_t* f = raw + i * imgops::device::kImageFields;
    imgops::device::Image& image = list[i];
    image.src = static_cast<uint64_t>(f[0]);
    image.pitch = f[1];
    image.row_bytes = f[2];
    image.height = f[3];
    image.bpp = f[4];
    image.pinned = static_cast<uint64_t>(f[5]);
    if (image.src == 0 || image.pinned == 0 || image.height < 1 || image.row_bytes < 0 ||
        image.pitch < image.row_bytes || image.bpp < 1 || image.bpp > 8) {
      PyErr_Format(PyExc_ValueError, "device_png_tail: image %zu is not a valid 8-bit image", i);
      return nullptr;
    }
  }
  std::vector<void*> handles(stream_count);
  for (size_t i = 0; i < stream_count; ++i) handles[i] = from_int64<void*>(s[i]);
  imgops::device::Outcome done;
  Py_BEGIN_ALLOW_THREADS;
  done = imgops::device::queue_png_tail(d, list.data(), count, filter, handles.data(),
                                        stream_count, reinterpret_cast<void*>(event),
                                        static_cast<size_t>(first), join != 0);
  Py_END_ALLOW_THREADS;
  return outcome_tuple(done);
}

PyObject* device_free(PyObject* /*self*/, PyObject* args) {
  TableArguments a(args, "device_free", 1, "ptrs");
  if (!a.ok()) return nullptr;
  const auto* list = reinterpret_cast<const uint64_t*>(a.values);
  imgops::device::Outcome done;
  Py_BEGIN_ALLOW_THREADS;
  done = imgops::device::queue_frees(a.driver, list, a.count, reinterpret_cast<void*>(a.stream));
  Py_END_ALLOW_THREADS;
  return outcome_tuple(done);
}

PyObject* checksums(PyObject* /*self*/, PyObject* args) {
  Py_buffer data;
  if (!PyArg_ParseTuple(args, "y*:checksums", &data)) return nullptr;
  const auto* p = static_cast<const uint8_t*>(data.buf);
  const size_t n = static_cast<size_t>(data.len);
  const uint32_t crc = imgops::png::crc32(0, p, n);
  const uint32_t adler = imgops::png::adler32(1, p, n);
  const uint32_t adler_scalar = imgops::png::adler32_scalar(1, p, n);
  const uint32_t crc_tables = imgops::png::crc32_tables(0, p, n);
  PyBuffer_Release(&data);
  return Py_BuildValue("(kkkk)", static_cast<unsigned long>(crc),
                       static_cast<unsigned long>(adler), static_cast<unsigned long>(adler_scalar),
                       static_cast<unsigned long>(crc_tables));
}

PyMethodDef methods[] = {
    {"rgb_to_gray", rgb_to_gray, METH_VARARGS,
     "rgb_to_gray(src, dst, itemsize, bgr, isa='best'): exact BT.601 luma of the interleaved\n"
     "3-channel uint8 (itemsize 1) or uint16 (itemsize 2) pixels in src into dst (one value\n"
     "each). isa names a loop (best, baseline, sse4.1, avx2) so that tests can check each."},
    {"png_filter_rows", png_filter_rows, METH_VARARGS,
     "png_filter_rows(rows, out, count, row_bytes, bpp, filter): PNG-filters rows[1..count]\n"
     "(rows[0] is the row above) into out, count rows of 1 + row_bytes bytes. filter: -1\n"
     "adaptive (Sub, Up or Average per row), 0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth."},
    {"png_encode", png_encode, METH_VARARGS,
     "png_encode(pixels, width, height, channels, itemsize, row_stride, filter) -> bytes: a\n"
     "whole PNG file: rows filtered with `filter` (-1..4, as png_filter_rows), the row deflate.\n"
     "16-bit samples in native byte order. Releases the GIL."},
    {"png_encode_filtered", png_encode_filtered, METH_VARARGS,
     "png_encode_filtered(rows, width, height, channels, itemsize) -> bytes: the PNG file of\n"
     "rows already filtered (height rows of 1 + row bytes), the same deflate as png_encode."},
    {"png_encode_filtered_emulated", png_encode_filtered_emulated, METH_VARARGS,
     "png_encode_filtered_emulated(rows, width, height, channels, itemsize) -> bytes: as\n"
     "png_encode_filtered, deflated by the GPU's code (png_deflate_parallel.h) run here one\n"
     "piece after another. RuntimeError if two pieces would write one word unsafely."},
    {"png_finish_zlib_to_file", png_finish_zlib_to_file, METH_VARARGS,
     "png_finish_zlib_to_file(buffer, room, out_bytes, width, height, channels, itemsize, temp,\n"
     "target, overwrite, durable) -> (bytes, finish seconds, write seconds): the device path's\n"
     "buffer (a zlib stream of at most out_bytes at PNG_HEAD_BYTES, its length as 8 little-endian\n"
     "bytes at room = png_file_room(out_bytes)) framed in place as png_finish_zlib does, then\n"
     "written as write_file_atomic does, in one call with the GIL released. RuntimeError if the\n"
     "length is under 6 or over out_bytes."},
    {"png_deflate_layout", png_deflate_layout, METH_VARARGS,
     "png_deflate_layout(row, height) -> (total, out, out_bytes, size, blocks): the device\n"
     "memory the GPU deflate of height filtered rows of `row` bytes needs (zeroed), where its\n"
     "zlib stream and the stream's length (uint64) land in it, and its block count."},
    {"png_file_room", png_file_room, METH_VARARGS,
     "png_file_room(zlib_bytes) -> int: bytes a buffer needs for png_finish_zlib to write the\n"
     "PNG file around a zlib stream of zlib_bytes (from PNG_HEAD_BYTES on)."},
    {"png_finish_zlib", png_finish_zlib, METH_VARARGS,
     "png_finish_zlib(buffer, zlib_bytes, width, height, channels, itemsize) -> int: writes the\n"
     "PNG file in place around the zlib stream at buffer[PNG_HEAD_BYTES:]: the signature,\n"
     "IHDR, IDAT chunk headers and CRCs, IEND; returns the file's length. Releases the GIL."},
    {"write_file_atomic", write_file_atomic, METH_VARARGS,
     "write_file_atomic(data, temp, target, overwrite, durable) -> int: writes data to the new\n"
     "file temp, then makes it target (never replacing one without overwrite: FileExistsError),\n"
     "with fsync of the file and its folder if durable; the temporary is removed on any error\n"
     "(OSError naming target or temp). Releases the GIL for all of it."},
    {"png_encode_to_file", png_encode_to_file, METH_VARARGS,
     "png_encode_to_file(pixels, width, height, channels, itemsize, row_stride, filter, temp,\n"
     "target, overwrite, durable) -> (bytes, encode_seconds, write_seconds): png_encode's file,\n"
     "encoded into a buffer the calling thread reuses and written as write_file_atomic writes."},
    {"read_file", read_file, METH_VARARGS,
     "read_file(path, limit) -> bytes, or why not: ('not regular', st_mode), ('too large',\n"
     "size), ('shrank', got, size), ('grew', size). Opens without blocking; OSError naming\n"
     "path for a failed open or read. Releases the GIL for the system calls."},
    {"fsync_count", fsync_count, METH_NOARGS,
     "fsync_count() -> int: fsync calls the native writers made in this process (tests)."},
    {"device_gray", device_gray, METH_VARARGS,
     "device_gray(table, images, stream) -> (code, call, owned): queues on `stream` each colour\n"
     "image's packed gray output (width * height bytes of stream-ordered device memory) and\n"
     "the luma kernel (device_batch.h), the GIL released. images: int64 x 5 each (src, pitch,\n"
     "width, height, bgr). owned: the outputs allocated, in image order (all of them unless\n"
     "code, the first CUresult that failed, is not 0; call names it)."},
    {"device_png_tail", device_png_tail, METH_VARARGS,
     "device_png_tail(table, images, filter, streams, event, first, join) -> (code, call,\n"
     "owned): queues the PNG row filter, the device deflate and the copies into pinned buffers\n"
     "of several images through the CUDA driver (device_batch.h), the GIL released.\n"
     "table: int64 x 15 (the driver functions' and kernels' addresses, the SM count); images:\n"
     "int64 x 6 each (src, pitch, row bytes, height, bpp, pinned); streams: int64, the stage's\n"
     "first (image i deflates on side stream (first + i) % sides); join: the stage's stream\n"
     "then waits for every side stream. code: the first CUresult that failed (0: none), call:\n"
     "its function, owned: the device memory not yet queued for freeing."},
    {"device_free", device_free, METH_VARARGS,
     "device_free(table, ptrs, stream) -> (code, call, owned): queues cuMemFreeAsync of each\n"
     "pointer (int64; 0 skipped) on `stream` in order (device_batch.h), the GIL released.\n"
     "code: the first CUresult that failed (0: none); owned: the pointers not freed."},
    {"checksums", checksums, METH_VARARGS,
     "checksums(data) -> (crc32, adler32, adler32 of the scalar loop, crc32 of the table loop),\n"
     "for tests."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cli_kernels",
    "imgops' command-line CPU kernels without torch (luma, PNG row filters).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__cli_kernels() {
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  // the file's bytes before the zlib stream, and the most bytes of one IDAT chunk
  if (PyModule_AddIntConstant(m, "PNG_HEAD_BYTES",
                              static_cast<long>(imgops::png::kHeadBytes)) != 0 ||
      PyModule_AddIntConstant(m, "PNG_IDAT_MAX", static_cast<long>(imgops::png::kIdatMax)) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
