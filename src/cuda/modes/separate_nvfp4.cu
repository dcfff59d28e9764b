// The replay kernels of checkpoint mode separate_nvfp4 (see src/cuda/replay_launch.h).
#include "cuda/replay_launch.cuh"

template struct replayssm::cuda::ModeLaunchers<replayssm::Mode::separate_nvfp4>;
