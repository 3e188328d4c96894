// Every schema of the imgops library, declared once. Kernels live in cpu/ and cuda/.
#include <Python.h>
#include <torch/library.h>

#include "build_config.h"

// Importing imgops._C runs the static registrations below and in the kernel files.
extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "imgops compiled kernels", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(imgops, m) {
  m.def("rgb_to_gray(Tensor image, str channel_order=\"rgb\") -> Tensor");
  m.def(
      "normalize_volume(Tensor volume, float max, float min=0.0, *, "
      "ScalarType? dtype=None, bool clip=False) -> Tensor");
  m.def("value_histogram(Tensor values) -> Tensor");
  m.def("png_filter(Tensor image, int filter) -> Tensor");
  m.def("bin(Tensor x, int[] factors) -> Tensor");
  m.def("_build_config() -> str", [] { return std::string(imgops::build_config()); });
}
