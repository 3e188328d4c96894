// imgops._C_stable: the stable-ABI prototype of rgb_to_gray (issue 13), built only with
// IMGOPS_STABLE_PROTOTYPE=1. Compiled with TORCH_TARGET_VERSION = 2.10 and Py_LIMITED_API, so
// one binary loads into every torch >= 2.10 and every CPython >= 3.10 (abi3). Schemas live in
// their own namespace, torch.ops.imgops_stable, beside the full extension's torch.ops.imgops.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include <string>

extern "C" {
PyObject* PyInit__C_stable(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C_stable", "imgops stable-ABI prototype", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

namespace imgops_stable {
namespace {

#define IMGOPS_STABLE_STR2(x) #x
#define IMGOPS_STABLE_STR(x) IMGOPS_STABLE_STR2(x)

// Which torch the binary was compiled against and whether CUDA kernels are in (JSON).
std::string build_config() {
  return "{\"torch\": \"" TORCH_VERSION "\", \"target\": \"2.10\", \"cuda_kernels\": "
#if defined(IMGOPS_WITH_CUDA)
         "true"
#else
         "false"
#endif
         "}";
}

}  // namespace
}  // namespace imgops_stable

STABLE_TORCH_LIBRARY(imgops_stable, m) {
  m.def("rgb_to_gray(Tensor image, str channel_order=\"rgb\") -> Tensor");
  m.def("_build_config() -> str");
}

STABLE_TORCH_LIBRARY_IMPL(imgops_stable, CompositeExplicitAutograd, m) {
  m.impl("_build_config", TORCH_BOX(&imgops_stable::build_config));
}
