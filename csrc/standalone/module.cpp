// imgops._cli_kernels: the command line's CPU kernels as a plain CPython module, free of torch,
// so that `imgops gray` on the CPU starts in a fraction of a second instead of waiting seconds
// for `import torch`:
// - rgb_to_gray runs the very loops of cpu/gray_span.h that the torch op runs;
// - png_filter_rows runs the PNG row filters of png_filter.h for imgops.io.png.
// One image (or strip) per call on the calling thread, with the GIL released: the command
// line's worker threads run several at once.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

#include "../cpu/gray_span.h"
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

PyMethodDef methods[] = {
    {"rgb_to_gray", rgb_to_gray, METH_VARARGS,
     "rgb_to_gray(src, dst, itemsize, bgr, isa='best'): exact BT.601 luma of the interleaved\n"
     "3-channel uint8 (itemsize 1) or uint16 (itemsize 2) pixels in src into dst (one value\n"
     "each). isa names a loop (best, baseline, sse4.1, avx2) so that tests can check each."},
    {"png_filter_rows", png_filter_rows, METH_VARARGS,
     "png_filter_rows(rows, out, count, row_bytes, bpp, filter): PNG-filters rows[1..count]\n"
     "(rows[0] is the row above) into out, count rows of 1 + row_bytes bytes. filter: -1\n"
     "adaptive (Sub, Up or Average per row), 0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cli_kernels",
    "imgops' command-line CPU kernels without torch (luma, PNG row filters).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__cli_kernels() { return PyModule_Create(&module); }
