#include "replayssm/version.h"

namespace replayssm {

const char* version() { return "0.1.0"; }

}  // namespace replayssm
