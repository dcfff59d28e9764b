// Where the built-in model (models/mamba2-byte-2.7m in the source tree) is found at run time.
#pragma once

#include <string>

namespace replayssm::model {

inline constexpr const char* kBuiltinModelName = "mamba2-byte-2.7m";

// The first of: $REPLAYSSM_MODEL_DIR; the source tree's models/ folder recorded at build time;
// models/ next to or above the running executable (build/bin/../../models, bin/../share/
// replayssm/models). Throws replayssm::Error listing the places tried when none exists.
std::string builtin_model_dir();

}  // namespace replayssm::model
