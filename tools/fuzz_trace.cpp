// libFuzzer target for the safetensors and trace readers (and, for small traces, the runner):
// any input must either be rejected with replayssm::Error or run cleanly; crashes, sanitizer
// reports, leaks and other exception types are bugs. Build and run (clang only):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DREPLAYSSM_FUZZ=ON -DREPLAYSSM_CUDA=OFF \
//     -DREPLAYSSM_TESTS=OFF && cmake --build build-fuzz --target fuzz_trace
//   build-fuzz/fuzz_trace -max_total_time=300 -max_len=200000 CORPUS_DIR tests/data/traces
#include <cstddef>
#include <cstdint>
#include <span>

#include "io/safetensors.h"
#include "io/trace.h"
#include "replayssm/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace replayssm;
  try {
    const io::StFile file = io::parse_safetensors(std::span<const uint8_t>(data, size), "fuzz");
    const io::Trace trace = io::parse_trace(file, "fuzz");
    // Run only small traces: a valid trace may legitimately describe a lot of work.
    int64_t tokens = 0;
    for (const io::TraceOp& op : trace.ops) tokens += int64_t(op.slots.size()) * op.window;
    if (trace.shape.state_elements() * trace.cache.num_slots <= (1 << 16) && tokens <= 4096) {
      io::run_trace(trace, {});
    }
  } catch (const Error&) {
    // Rejected with a message: the expected outcome for malformed input.
  }
  return 0;
}
