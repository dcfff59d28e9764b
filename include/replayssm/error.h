// The one exception type of the library. Every message names the problem and the offending value;
// an operation that throws has changed nothing.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace replayssm {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message from its parts, streamed in order: fail("window ", w, " exceeds ", max).
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(message.str());
}

template <typename... Parts>
void check(bool condition, Parts&&... parts) {
  if (!condition) fail(std::forward<Parts>(parts)...);
}

}  // namespace replayssm
