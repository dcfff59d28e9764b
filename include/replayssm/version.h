#pragma once

namespace replayssm {

// The library version, "MAJOR.MINOR.PATCH".
const char* version();

// The git commit the library was built from: 12 hex digits, with "-dirty" when tracked files had
// uncommitted changes; the CMake option REPLAYSSM_BUILD_COMMIT where the tree has no .git (a copy
// on another machine); otherwise "unknown". Benchmark outputs carry it (`replayssm bench`).
const char* build_commit();

}  // namespace replayssm
