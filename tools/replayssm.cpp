#include <cstdio>

#include "replayssm/version.h"

int main() {
  std::printf("replayssm %s\n", replayssm::version());
  return 0;
}
