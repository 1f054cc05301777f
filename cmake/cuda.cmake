# KVT_CUDA: off (never), auto (when a CUDA compiler is found), on (required).
# Sets KVT_CUDA_ENABLED: the L1 cuda tier (src/tier/cuda.c, C against the
# CUDA runtime, and its copy kernel, cuda_copy.cu) and the kernels suite are
# then built.
set(KVT_CUDA_ENABLED OFF)
if(KVT_CUDA STREQUAL "on" OR KVT_CUDA STREQUAL "auto")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Turing, Ampere as machine code; Hopper as machine code and PTX (what later GPUs compile at load)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;90")
    endif()
    enable_language(CUDA)
    set(KVT_CUDA_ENABLED ON)
  elseif(KVT_CUDA STREQUAL "on")
    message(FATAL_ERROR "KVT_CUDA=on but no CUDA compiler was found (install the CUDA toolkit or use KVT_CUDA=auto|off)")
  endif()
elseif(NOT KVT_CUDA STREQUAL "off")
  message(FATAL_ERROR "KVT_CUDA must be auto, on or off (got '${KVT_CUDA}')")
endif()
