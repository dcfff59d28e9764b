// The replay kernels of checkpoint mode fp16_sr (see src/cuda/replay_launch.h).
#include "cuda/replay_launch.cuh"

template struct replayssm::cuda::ModeLaunchers<replayssm::Mode::fp16_sr>;
