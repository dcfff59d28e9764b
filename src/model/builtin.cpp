#include "model/builtin.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "replayssm/error.h"

#ifndef REPLAYSSM_BUILTIN_MODEL_DIR
#define REPLAYSSM_BUILTIN_MODEL_DIR ""
#endif

namespace replayssm::model {

namespace fs = std::filesystem;

std::string builtin_model_dir() {
  std::vector<fs::path> tried;
  if (const char* env = std::getenv("REPLAYSSM_MODEL_DIR"); env && *env) tried.emplace_back(env);
  if (*REPLAYSSM_BUILTIN_MODEL_DIR) tried.emplace_back(REPLAYSSM_BUILTIN_MODEL_DIR);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    tried.push_back(bin / "../../models" / kBuiltinModelName);
    tried.push_back(bin / "../models" / kBuiltinModelName);
    tried.push_back(bin / "../share/replayssm/models" / kBuiltinModelName);
  }
  std::string list;
  for (const fs::path& p : tried) {
    if (fs::exists(p / "config.json", ec)) return p.lexically_normal().string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  fail("the built-in model ", kBuiltinModelName, " was not found (tried: ", list,
       "); pass -m DIR or set REPLAYSSM_MODEL_DIR");
}

}  // namespace replayssm::model
