// The `replayssm` program as users run it: exit codes, one-line errors, --help everywhere, both
// mode vocabularies, and trace gen -> run -> check through files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/safetensors.h"
#include "io/trace.h"

namespace replayssm {
namespace {

namespace fs = std::filesystem;

struct Result {
  int code;
  std::string out, err;
  int err_lines() const { return int(std::count(err.begin(), err.end(), '\n')); }
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string.
    std::string name = "replayssm_cli_";
    name += std::to_string(::getpid());
    name += '_';
    name += ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / name;
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  Result run(const std::string& args) const {
    const std::string cmd =
        std::string(REPLAYSSM_CLI) + " " + args + " >" + path("stdout") + " 2>" + path("stderr");
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(path("stdout")),
            slurp(path("stderr"))};
  }

  // A command that prints JSON, run and parsed; a non-zero exit fails the test (and gives null,
  // whose fields then cannot be read).
  nlohmann::json run_json(const std::string& args) const {
    const Result r = run(args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.err;
    return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
  }

  fs::path dir_;
};

TEST_F(Cli, HelpEverywhere) {
  for (const char* cmd : {"", "trace", "trace gen", "trace run", "trace check", "ckpt",
                          "ckpt inspect", "ckpt convert", "demo", "plan", "bench"}) {
    const Result r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd << ": " << r.out;
  }
  const Result r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_FALSE(r.out.empty());
}

TEST_F(Cli, ErrorsAreOneClearLine) {
  struct Case {
    std::string args, text;
  };
  const std::vector<Case> cases = {
      {"", "A subcommand is required"},
      {"frobnicate", "frobnicate"},
      {"trace gen -o " + path("t.st") + " --mode fp12", "unknown checkpoint mode 'fp12'"},
      {"trace gen -o " + path("t.st") + " --checkpoint-mode separate --state-dtype int8",
       "separate takes --state-dtype fp8 or nvfp4"},
      {"trace gen -o " + path("t.st") + " --mode fp32 --checkpoint-mode separate --state-dtype fp8",
       "excludes"},
      {"trace gen -o " + path("t.st") + " --checkpoint-mode separate", "requires"},
      {"trace gen -o " + path("t.st") + " --shape 4,16,x,2", "--shape '4,16,x,2'"},
      {"trace gen -o " + path("t.st") + " --shape 6,16,32,4", "ngroups"},
      {"trace gen -o " + path("t.st") + " --window 9", "--window 9"},
      {"trace gen", "--output is required"},
      {"trace run " + path("missing.safetensors"), "cannot open"},
      {"trace run " + path("t.st") + " --backend tpu", "--backend"},
      {"trace check " + path("a") + " " + path("b"), "cannot open"},
      {"demo --preset huge", "unknown model preset 'huge'"},
      {"demo --modes fp32,fp7", "unknown checkpoint mode 'fp7'"},
      {"demo --window 3 --accept-mean 5", "--accept-mean 5"},
      {"ckpt inspect " + path("missing"), "cannot open"},
      {"ckpt convert " + path("missing") + " -o " + path("x"), "needs a target mode"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_EQ(r.err_lines(), 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.text), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("replayssm: error: ", 0), 0u) << r.err;
  }
}

TEST_F(Cli, CorruptTraceFiles) {
  ASSERT_EQ(run("trace gen -o " + path("t.safetensors") + " --steps 8").code, 0);
  const std::vector<uint8_t> good = io::read_file_bytes(path("t.safetensors"));
  // Truncated.
  io::write_file_bytes(path("cut.safetensors"),
                       std::vector<uint8_t>(good.begin(), good.begin() + long(good.size() / 2)));
  Result r = run("trace run " + path("cut.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  // Not a trace (a plain safetensors file).
  io::StFile plain;
  plain.tensors["w"] = io::make_f32({1}, std::vector<float>{1});
  io::write_safetensors(path("plain.safetensors"), plain);
  r = run("trace run " + path("plain.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not a replayssm trace"), std::string::npos) << r.err;
  // Garbage.
  io::write_file_bytes(path("junk"), std::vector<uint8_t>(100, 0xff));
  r = run("trace run " + path("junk"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err_lines(), 1) << r.err;
}

TEST_F(Cli, GenRunCheck) {
  const std::string trace = path("t.safetensors");
  Result r =
      run("trace gen --shape 4,8,16,2 --steps 30 --slots 3 --window 4 --seed 3 "
          "--checkpoint-mode separate --state-dtype nvfp4 -o " +
          trace);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(io::read_trace(trace).cache.mode, Mode::separate_nvfp4);
  r = run("trace run " + trace + " -q");  // default output name
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.empty());
  ASSERT_TRUE(fs::exists(path("t.out.safetensors")));
  r = run("trace run " + trace + " --backend cpu -o " + path("again.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("trace check " + path("again.safetensors") + " " + path("t.out.safetensors"));
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OK: 0 of"), std::string::npos) << r.out;

  // Another mode differs; the table names failing tensors and the exit status is 1.
  r = run("trace run " + trace + " --mode fp32 -o " + path("fp32.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("trace check " + path("fp32.safetensors") + " " + path("t.out.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("MISMATCH"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
  // ... and passes with tolerances wide enough.
  EXPECT_EQ(run("trace check " + path("fp32.safetensors") + " " + path("t.out.safetensors") +
                " --rtol 10 --atol 10")
                .code,
            0);

  // JSON output lists every tensor.
  r = run("trace check " + path("again.safetensors") + " " + path("t.out.safetensors") +
          " -o json --all");
  ASSERT_EQ(r.code, 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_GT(j["tensors"].size(), 5u);

  // A NaN in the output fails the check whatever the tolerance.
  io::StFile out = io::read_safetensors(path("again.safetensors"));
  std::string y;
  for (const auto& [name, t] : out.tensors)
    if (name.rfind("y.", 0) == 0) y = name;
  std::vector<float> v = out.tensors[y].f32(y);
  v[0] = NAN;
  out.tensors[y] = io::make_f32(out.tensors[y].shape, v);
  io::write_safetensors(path("nan.safetensors"), out);
  r = run("trace check " + path("nan.safetensors") + " " + path("t.out.safetensors") +
          " --rtol 1e9 --atol 1e9");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(y), std::string::npos) << r.out;
}

// Several -p: one batch (generate_batch), one line per prompt, "INDEX: TEXT" with control
// characters escaped; each line holds what a run with that prompt alone prints (greedy, fp32).
TEST_F(Cli, GenerateBatchPrintsOneLinePerPrompt) {
  const std::vector<std::string> prompts = {"def area(r): return", "import os, sys",
                                            "for i in range(3): print("};
  std::string args = "generate -n 64 --draft-max 3 --threads 1";
  for (const std::string& p : prompts) args += " -p '" + p + "'";
  const Result batch = run(args);
  ASSERT_EQ(batch.code, 0) << batch.err;
  EXPECT_NE(batch.err.find("batch of 3"), std::string::npos) << batch.err;
  std::string expected;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Result one = run("generate -n 64 --draft-max 3 --threads 1 -p '" + prompts[i] + "'");
    ASSERT_EQ(one.code, 0) << one.err;
    std::string line = std::to_string(i) + ": ";
    for (const char ch : one.out) {
      if (ch == '\n') {
        line += "\\n";
      } else if (ch == '\\') {
        line += "\\\\";
      } else {
        ASSERT_TRUE(static_cast<unsigned char>(ch) >= 0x20) << "test covers \\n and \\ only";
        line += ch;
      }
    }
    expected += line + "\n";
  }
  EXPECT_EQ(batch.out, expected);
}

TEST_F(Cli, CheckpointInspectAndConvert) {
  // Find a seed whose trace exports a slot (exports are random lifecycle ops).
  std::string out;
  for (int seed = 1; seed < 40 && out.empty(); ++seed) {
    const std::string trace = path(std::to_string(seed) + ".safetensors");
    ASSERT_EQ(run("trace gen --shape 2,8,16,1 --steps 40 --seed " + std::to_string(seed) +
                  " --mode fp16 -o " + trace)
                  .code,
              0);
    ASSERT_EQ(run("trace run -q " + trace + " -o " + path("o.safetensors")).code, 0);
    const io::StFile file = io::read_safetensors(path("o.safetensors"));
    int exports = 0;
    for (const auto& [name, t] : file.tensors) exports += name.rfind("export.", 0) == 0;
    if (exports == 1) {
      out = path("o.safetensors");
      fs::copy_file(trace, path("params.safetensors"));
    }
  }
  ASSERT_FALSE(out.empty()) << "no generated trace with exactly one export";
  Result r = run("ckpt inspect " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("mode              fp16"), std::string::npos) << r.out;
  r = run("ckpt inspect " + out + " -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["mode"], "fp16");

  r = run("ckpt convert " + out + " --mode separate-fp8 --params " + path("params.safetensors") +
          " -o " + path("c.slot"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("ckpt inspect " + path("c.slot") + " -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mode"], "separate-fp8");
  EXPECT_EQ(j["cursors"]["committed"], 0);

  // Corrupt slot files are rejected by the checksum.
  std::vector<uint8_t> bytes = io::read_file_bytes(path("c.slot"));
  bytes[bytes.size() / 2] ^= 1;
  io::write_file_bytes(path("bad.slot"), bytes);
  r = run("ckpt inspect " + path("bad.slot"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
}

TEST_F(Cli, DemoTinyJson) {
  const nlohmann::json j = run_json("demo --preset tiny --tokens 24 --batch 2 -o json");
  ASSERT_EQ(j["modes"].size(), 8u);
  EXPECT_EQ(j["modes"][0]["mode"], "fp32");
  EXPECT_EQ(j["modes"][0]["max_error"], 0.0);
  for (const auto& m : j["modes"]) {
    EXPECT_GT(m["tokens_per_second"].get<double>(), 0) << m;
    EXPECT_LT(m["relative_rms_error"].get<double>(), 0.2) << m;
  }
  // Fewer stored bytes in the 8-bit shared modes than in fp32, and less checkpoint traffic in
  // every low-precision read mode.
  EXPECT_LT(j["modes"][5]["stored_bytes_per_element"].get<double>(), 1.5);
  EXPECT_LT(j["modes"][7]["checkpoint_bytes_read_per_token"].get<double>(),
            j["modes"][0]["checkpoint_bytes_read_per_token"].get<double>());
}

TEST_F(Cli, DemoTableAndSeedVocabulary) {
  const Result r = run("demo --preset tiny --tokens 16 --batch 1 --modes separate-nvfp4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("fp32"), std::string::npos);
  EXPECT_NE(r.out.find("separate-nvfp4"), std::string::npos);
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << "no progress bar when stderr is not a terminal: " << r.err;
}

// plan: per-layer bytes are the slot layout's (fp32: the state plus a bf16 ring), the standard
// speculative baseline holds 1 + W states, and the request count is the budget over the bytes.
TEST_F(Cli, PlanCountsBytesAndRequests) {
  const nlohmann::json j = run_json("plan --model nemotron-h-8b --memory 10 -o json");
  const double state = 128.0 * 64 * 128;
  const double ring = 16.0 * (128 * 64 * 2 + 8 * 128 * 2 + 128 * 4);
  std::map<std::string, nlohmann::json> rows;
  for (const auto& row : j["rows"]) rows[row["name"].get<std::string>()] = row;
  ASSERT_EQ(rows.size(), 12u);
  EXPECT_EQ(rows["fp32"]["bytes_per_layer"].get<double>(), state * 4 + ring);
  EXPECT_EQ(rows["standard fp32 (spec W=8)"]["bytes_per_layer"].get<double>(), state * 4 * 9);
  const double per_request = (state + state * 4 / 128 + ring) * 24;  // shared-fp8
  EXPECT_EQ(rows["shared-fp8"]["requests"].get<int64_t>(), int64_t(10e9 / per_request));
  EXPECT_EQ(run("plan --model nope").code, 1);
  EXPECT_EQ(run("plan --mode separate-nvfp4 --model falcon-h1-7b").code, 0);
}

// bench -o json prints its document only at the end; stderr carries the copy bandwidth, the run's
// settings and each row as it is measured, with what a run stopped by a time limit needs to be
// read (time, bytes, bandwidth, settings), and the same numbers as the JSON.
TEST_F(Cli, BenchJsonRowsOnStderr) {
  const Result r =
      run("bench --backend cpu --shape 4,16,64,2 --batches 2 --windows 1 --modes fp32 --repeats 1 "
          "--flush-cycles 1 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(r.err.find(fmt::format("copy bandwidth {:.0f} GB/s", j["copy_gb_per_s"].get<double>())),
            std::string::npos)
      << r.err;
  ASSERT_EQ(j["rows"].size(), 3u);  // 2 standard + fp32
  for (const auto& row : j["rows"]) {
    const std::string line = fmt::format(
        "[bench] {}, batch 2, W 1: {:.1f} us/step, {:.1f} MB/step, {:.0f} GB/s, {:.1f}% of copy "
        "bandwidth\n",
        row["name"].get<std::string>(), row["us_per_step"].get<double>(),
        row["modelled_bytes_per_step"].get<double>() / 1e6, row["gb_per_s"].get<double>(),
        100.0 * row["gb_per_s"].get<double>() / j["copy_gb_per_s"].get<double>());
    EXPECT_NE(r.err.find(line), std::string::npos) << line << " in\n" << r.err;
  }
  // The settings line holds the document's fields except the rows and the provenance.
  const std::string tag = "[bench] settings ";
  const size_t at = r.err.find(tag);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_LT(at, r.err.find(", batch 2, W 1: ")) << "a run cut short needs it before its rows";
  const size_t from = at + tag.size();
  const nlohmann::json settings =
      nlohmann::json::parse(r.err.substr(from, r.err.find('\n', from) - from));
  nlohmann::json expected = j;
  for (const char* key : {"rows", "replayssm_version", "commit", "command", "started_utc"})
    expected.erase(key);
  EXPECT_EQ(settings, expected);
  EXPECT_EQ(settings["history"], 16);
  EXPECT_EQ(settings["shape"], nlohmann::json({4, 16, 64, 2}));
}

// Benchmark outputs say where they came from: the version and build commit that --version prints,
// the command line as run, and the UTC start time.
TEST_F(Cli, BenchJsonRecordsProvenance) {
  const std::string args =
      "bench --backend cpu --shape 4,16,64,2 --batches 2 --windows 1 --modes fp32 --repeats 1 "
      "--flush-cycles 1 -o json";
  const nlohmann::json j = run_json(args);
  const Result version = run("--version");
  ASSERT_EQ(version.code, 0);
  const std::string commit = j["commit"].get<std::string>();
  EXPECT_FALSE(commit.empty());
  EXPECT_NE(
      version.out.find(j["replayssm_version"].get<std::string>() + " (commit " + commit + ")"),
      std::string::npos)
      << version.out << " vs " << j.dump();
  const std::string command = j["command"].get<std::string>();
  EXPECT_TRUE(command.size() > args.size() &&
              command.compare(command.size() - args.size(), args.size(), args) == 0)
      << command;
  EXPECT_TRUE(std::regex_match(j["started_utc"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << j["started_utc"];
}

// bench on the CPU: every configuration is timed (positive, finite), the modelled bytes of the
// standard kernel are exactly its state traffic plus inputs and outputs, and bad options fail.
TEST_F(Cli, BenchTimesEveryConfiguration) {
  const nlohmann::json j = run_json(
      "bench --backend cpu --shape 4,16,64,2 --batches 2 --windows 1,4 --accept-mean 2 "
      "--repeats 1 --flush-cycles 1 -o json");
  // What the timings ran on is recorded beside them.
  EXPECT_NE(j["device"].get<std::string>().find("OpenMP threads"), std::string::npos)
      << j["device"];
  ASSERT_EQ(j["rows"].size(), 12u);  // 2 windows x (2 standard + 4 replay modes)
  for (const auto& row : j["rows"]) {
    const double us = row["us_per_step"].get<double>();
    EXPECT_TRUE(std::isfinite(us) && us > 0) << row.dump();
  }
  const auto& std_fp32 = j["rows"][0];
  ASSERT_EQ(std_fp32["name"], "standard fp32 state");
  const double state = 4.0 * 16 * 64 * 4, io = 2 * 4 * 16 * 2 + 2 * 2 * 64 * 2 + 4 * 4;
  EXPECT_EQ(std_fp32["modelled_bytes_per_step"].get<double>(), 2 * (2 * state + io));
  EXPECT_NE(run("bench --backend cpu --windows 9").code, 0);
  EXPECT_NE(run("bench --backend cpu --windows 1,4 --accept-mean 4.3").code, 0);
  EXPECT_NE(run("bench --backend cpu --windows 1 --accept-mean 2").code, 0);
  // Without --accept-mean the seed's 4.3 at W = 8 sets the per-draft acceptance at any window.
  const nlohmann::json jseed = run_json(
      "bench --backend cpu --shape 4,16,64,2 --batches 2 --windows 4 --modes fp32 "
      "--repeats 1 --flush-cycles 1 -o json");
  EXPECT_EQ(jseed["accept_window"].get<int>(), 8);
  EXPECT_NEAR(jseed["accept_rate"].get<double>(), 0.811, 5e-4);
  EXPECT_EQ(j["accept_window"].get<int>(), 4);  // --accept-mean 2 at the largest window, 4
  EXPECT_NE(run("bench --backend cpu --model nope").code, 0);

  // --cold-l2: the same rows, each step timed on its own after the caches are scrubbed.
  const nlohmann::json jc = run_json(
      "bench --backend cpu --shape 4,16,64,2 --batches 2 --windows 1 --modes fp32 --repeats 1 "
      "--flush-cycles 1 --cold-l2 -o json");
  EXPECT_TRUE(jc["cold_cache"].get<bool>());
  ASSERT_EQ(jc["rows"].size(), 3u);
  for (const auto& row : jc["rows"]) {
    const double us = row["us_per_step"].get<double>();
    EXPECT_TRUE(std::isfinite(us) && us > 0) << row.dump();
  }
  EXPECT_FALSE(j["cold_cache"].get<bool>());
  EXPECT_NE(run("bench --e2e --backend cpu --model tiny --cold-l2").code, 0);

  // --phases: spread (the default) starts slot b b mod history entries into its ring; lockstep
  // starts every ring empty. History 4, batch 4, W = 1, 8 steps: in lockstep the slots each
  // flush once (committed counts read 0,1,2,3,4,1,2,3); spread, slots 1-3 flush twice and read 4
  // more committed entries each (sums 16, 20, 20, 20). Each extra flush reads and writes the fp32
  // recurrence checkpoint instead of reading it: 16384 more bytes; an entry is x, B and delta:
  // 4 x 16 x 2 + 2 x 64 x 2 + 4 x 4 = 400 bytes.
  const std::string small =
      "bench --backend cpu --shape 4,16,64,2 --batches 4 --history 4 --windows 1 --modes fp32 "
      "--repeats 1 --flush-cycles 2 -o json";
  const Result spread = run(small), lockstep = run(small + " --phases lockstep");
  ASSERT_EQ(spread.code, 0) << spread.err;
  ASSERT_EQ(lockstep.code, 0) << lockstep.err;
  const nlohmann::json js = nlohmann::json::parse(spread.out),
                       jl = nlohmann::json::parse(lockstep.out);
  EXPECT_EQ(js["phases"], "spread");
  EXPECT_EQ(jl["phases"], "lockstep");
  ASSERT_EQ(js["rows"].size(), 3u);
  ASSERT_EQ(js["rows"][2]["name"], "replay fp32");
  EXPECT_TRUE(std::isfinite(js["rows"][2]["us_per_step"].get<double>()));
  EXPECT_EQ(js["rows"][2]["modelled_bytes_per_step"].get<double>() -
                jl["rows"][2]["modelled_bytes_per_step"].get<double>(),
            (3 * 16384.0 + 12 * 400.0) / 8);
  const nlohmann::json jn = run_json(small + " --phases spread");
  EXPECT_EQ(jn["phases"], "spread");
  EXPECT_EQ(jn["rows"][2]["modelled_bytes_per_step"], js["rows"][2]["modelled_bytes_per_step"]);
  const Result bad = run(small + " --phases sometimes");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--phases"), std::string::npos) << bad.err;
  EXPECT_NE(run("bench --e2e --backend cpu --model tiny --phases lockstep").code, 0);
}

// bench --e2e on the CPU with the tiny preset: one row per configuration in order, every number
// positive and finite, the same synthetic acceptance in every speculative row, the markdown table
// with the same rows, and bad options failing with one line.
TEST_F(Cli, BenchE2eReportsEveryConfiguration) {
  const std::string args =
      "bench --e2e --backend cpu --model tiny --prompt-len 20 --new-tokens 24 --window 8 "
      "--accept-mean 4.3 --modes fp32,separate-nvfp4 --threads 1";
  const nlohmann::json j = run_json(args + " -o json");
  EXPECT_EQ(j["model"], "tiny");
  const std::vector<std::string> names = {"standard fp32 (plain decode)",
                                          "standard bf16 (plain decode)", "standard fp32 W=8",
                                          "replay fp32 W=8", "replay separate-nvfp4 W=8"};
  ASSERT_EQ(j["rows"].size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& row = j["rows"][i];
    EXPECT_EQ(row["name"], names[i]);
    for (const char* key : {"decode_tokens_per_s_per_user", "ms_per_token", "mean_accepted_length",
                            "prefill_seconds", "speedup_vs_standard_fp32"}) {
      const double v = row[key].get<double>();
      EXPECT_TRUE(std::isfinite(v) && v > 0) << key << ": " << row.dump();
    }
    EXPECT_EQ(row["generated"], 24) << row.dump();
    const double accepted = row["mean_accepted_length"].get<double>();
    if (i < 2) {
      EXPECT_EQ(row["window"], 1);
      EXPECT_EQ(accepted, 1.0);
    } else {
      EXPECT_EQ(row["window"], 8);
      EXPECT_GT(accepted, 1.0);
      EXPECT_EQ(accepted, j["rows"][2]["mean_accepted_length"].get<double>());
    }
  }
  EXPECT_EQ(j["rows"][0]["speedup_vs_standard_fp32"].get<double>(), 1.0);

  const Result md = run(args);
  ASSERT_EQ(md.code, 0) << md.err;
  for (const std::string& name : names)
    EXPECT_NE(md.out.find("| " + name + " |"), std::string::npos);
  const Result csv = run(args + " -o csv");
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(std::count(csv.out.begin(), csv.out.end(), '\n'), 1 + int(names.size()));

  for (const char* bad : {"--window 1", "--window 9", "--accept-mean 9", "--shape 4,16,32,1",
                          "--new-tokens 0", "--modes nope", "--model nope"}) {
    const Result e =
        run("bench --e2e --backend cpu --model tiny --new-tokens 4 " + std::string(bad));
    EXPECT_NE(e.code, 0) << bad;
    EXPECT_NE(e.err.find("rror"), std::string::npos) << bad << ": " << e.err;
  }
}

}  // namespace
}  // namespace replayssm
