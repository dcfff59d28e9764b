// The replay kernels of checkpoint mode shared_fp8 (see src/cuda/replay_launch.h).
#include "cuda/replay_launch.cuh"

template struct replayssm::cuda::ModeLaunchers<replayssm::Mode::shared_fp8>;
