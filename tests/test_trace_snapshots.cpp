// Snapshot tests: the committed traces under tests/data/traces are replayed in every mode and
// compared with the stored CPU outputs, so any change of numerics shows up in review as changed
// files (regenerate.sh rewrites them; say why in the commit). The CUDA backend is checked against
// the same files by test_trace_snapshots_cuda (label gpu) with looser tolerances.
#include <gtest/gtest.h>

#include <filesystem>

#include "io/trace.h"

namespace replayssm::io {
namespace {

const std::filesystem::path kDir = std::filesystem::path(REPLAYSSM_TEST_DATA) / "traces";

void check_snapshots(BackendKind backend, double rtol, double atol) {
  int checked = 0;
  for (const char* name : {"spec", "ar"}) {
    const Trace trace = read_trace((kDir / (std::string(name) + ".safetensors")).string());
    for (Mode mode : kAllModes) {
      const std::string ref_path =
          (kDir / (std::string(name) + "." + mode_name(mode) + ".out.safetensors")).string();
      RunOptions options;
      options.backend = backend;
      options.mode = mode;
      const StFile out = run_trace(trace, options);
      const CompareResult result = compare_outputs(out, read_safetensors(ref_path), rtol, atol);
      for (const TensorDiff& d : result.tensors) {
        EXPECT_TRUE(d.ok()) << ref_path << ": " << d.name << " " << d.shape << " max abs "
                            << d.max_abs << " mismatches " << d.mismatches << " nonfinite "
                            << d.nans << " " << d.problem;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);
}

TEST(TraceSnapshots, CpuMatchesStoredOutputs) { check_snapshots(BackendKind::cpu, 1e-4, 1e-5); }

}  // namespace
}  // namespace replayssm::io
