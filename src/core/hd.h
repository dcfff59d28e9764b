// Marks functions shared by host and device code. Every codec, the Philox generator and the
// cursor rules are written once with RSSM_HD so the CPU reference and the CUDA kernels run the
// same arithmetic bit for bit.
#pragma once

#if defined(__CUDACC__)
#define RSSM_HD __host__ __device__ __forceinline__
#else
#define RSSM_HD inline
#endif
