// The replay kernels of checkpoint mode fp32 (see src/cuda/replay_launch.h).
#include "cuda/replay_launch.cuh"

template struct replayssm::cuda::ModeLaunchers<replayssm::Mode::fp32>;
