// replayssm demo
#include "cli_common.h"

namespace replayssm::cli {

void register_demo(CLI::App& app) {
  app.add_subcommand("demo", "synthetic multi-layer Mamba-2 speculative decode in every mode");
}

}  // namespace replayssm::cli
