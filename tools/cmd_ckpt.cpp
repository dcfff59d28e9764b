// replayssm ckpt inspect | convert
#include "cli_common.h"

namespace replayssm::cli {

void register_ckpt(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect and convert exported slot checkpoints");
  ckpt->require_subcommand(1);
}

}  // namespace replayssm::cli
