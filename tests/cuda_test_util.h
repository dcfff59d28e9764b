// Helpers shared by the tests that call the CUDA runtime themselves.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

// Fails the test (and returns from the void function it is in) when a CUDA call does not succeed.
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
