#pragma once

namespace replayssm {

// The library version, "MAJOR.MINOR.PATCH".
const char* version();

}  // namespace replayssm
