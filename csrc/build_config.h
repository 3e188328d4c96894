// What this binary was built with, read back by imgops.build_info() and the loader.
#pragma once

#include <torch/version.h>

namespace imgops {

#define IMGOPS_STR2(x) #x
#define IMGOPS_STR(x) IMGOPS_STR2(x)

// A small JSON object: the torch version compiled against and whether CUDA kernels are in.
inline const char* build_config() {
  return "{\"torch\": \"" TORCH_VERSION "\", \"cuda_kernels\": "
#if defined(IMGOPS_WITH_CUDA)
         "true"
#else
         "false"
#endif
         "}";
}

}  // namespace imgops
