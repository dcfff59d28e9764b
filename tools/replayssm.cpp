// The `replayssm` program: trace runner, checkpoint tools and the demo (docs/cli.md).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli_common.h"
#include "replayssm/error.h"
#include "replayssm/version.h"

int main(int argc, char** argv) {
  replayssm::cli::record_command_line(argc, argv);
  CLI::App app{
      "replayssm: fast Mamba-2 decoding with a replay cache.\n"
      "Run `replayssm demo` for the main job, `replayssm COMMAND --help` for details."};
  app.name("replayssm");
  app.set_version_flag("--version", replayssm::cli::version_line());
  app.require_subcommand(1);
  replayssm::cli::register_trace(app);
  replayssm::cli::register_ckpt(app);
  replayssm::cli::register_demo(app);
  replayssm::cli::register_plan(app);
  replayssm::cli::register_bench(app);
  replayssm::cli::register_drift(app);
  replayssm::cli::register_generate(app);
  // CLI11 reports a misspelled command as "a subcommand is required"; name it instead.
  CLI::App* current = &app;
  for (int i = 1; i < argc && argv[i][0] != '-'; ++i) {
    const std::vector<CLI::App*> subs = current->get_subcommands({});
    if (subs.empty()) break;
    CLI::App* next = nullptr;
    for (CLI::App* sub : subs)
      if (sub->get_name() == argv[i]) next = sub;
    if (!next) {
      std::string names;
      for (CLI::App* sub : subs) names += (names.empty() ? "" : ", ") + sub->get_name();
      fmt::print(stderr, "replayssm: error: unknown command '{}' (expected {}; see --help)\n",
                 argv[i], names);
      return 2;
    }
    current = next;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const replayssm::cli::ExitStatus& e) {
    return e.code;
  } catch (const CLI::ParseError& e) {
    // One line, naming the problem; usage is one --help away.
    fmt::print(stderr, "replayssm: error: {} (see --help)\n", e.what());
    return 2;
  } catch (const replayssm::Error& e) {
    fmt::print(stderr, "replayssm: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "replayssm: internal error: {}\n", e.what());
    return 3;
  }
  return 0;
}
