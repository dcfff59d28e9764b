// The replay kernels of checkpoint mode bf16 (see src/cuda/replay_launch.h).
#include "cuda/replay_launch.cuh"

template struct replayssm::cuda::ModeLaunchers<replayssm::Mode::bf16>;
