// imgops._gray_cpu: the CPU luma kernel as a plain CPython module, free of torch, so that
// `imgops gray` on the CPU starts in a fraction of a second instead of waiting seconds for
// `import torch`. It runs the very loops of cpu/gray_span.h that the torch op runs, one image
// per call on the calling thread (the command line's worker threads run several images at
// once), with the GIL released.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

#include "../cpu/gray_span.h"

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

PyMethodDef methods[] = {
    {"rgb_to_gray", rgb_to_gray, METH_VARARGS,
     "rgb_to_gray(src, dst, itemsize, bgr, isa='best'): exact BT.601 luma of the interleaved\n"
     "3-channel uint8 (itemsize 1) or uint16 (itemsize 2) pixels in src into dst (one value\n"
     "each). isa names a loop (best, baseline, sse4.1, avx2) so that tests can check each."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gray_cpu",
    "The CPU luma kernel of imgops without torch (see imgops.pipeline).", -1, methods,
};

}  // namespace

PyMODINIT_FUNC PyInit__gray_cpu() { return PyModule_Create(&module); }
