// Helpers of the route tests: a scratch directory, running the dsa-verify program, files.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dsa/fixtures/safetensors.h"
#include "dsa/property_tests/suite.h"

namespace dsa::cli::test {

/// A fresh directory under the system temp dir, removed at the end of the test.
class Scratch {
 public:
  // Unique per process: tests of several checkouts (or ctest -j) may run at once.
  explicit Scratch(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("dsa_routes_" + std::to_string(::getpid()) + "_" + name)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// Runs `dsa-verify ARGS`, printing its output; returns its exit status (-1 if it did not exit).
inline int run_cli(const std::string& args) {
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("dsa_routes_cli_" + std::to_string(::getpid()) + ".log")).string();
  const std::string cmd = std::string(DSA_VERIFY) + " " + args + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::cout << "$ dsa-verify " << args << "\n" << in.rdbuf();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Runs `dsa-verify ARGS`; `*output` receives its stdout and stderr together; returns its exit
/// status (-1 if it did not exit).
/// `env` ("NAME=value ...", optional) is set for that run only.
inline int run_cli_capture(const std::string& args, std::string* output, const std::string& env = "") {
  const std::string log = (std::filesystem::temp_directory_path() /
                           ("dsa_routes_cli_" + std::to_string(::getpid()) + ".log")).string();
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(DSA_VERIFY) + " " + args +
                          " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream all;
  all << in.rdbuf();
  *output = all.str();
  std::cout << "$ dsa-verify " << args << "\n" << *output;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The lines of `text` that contain every one of `words`.
inline std::vector<std::string> lines_with(const std::string& text, const std::vector<std::string>& words) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    bool all = true;
    for (const auto& w : words) all &= line.find(w) != std::string::npos;
    if (all) out.push_back(line);
  }
  return out;
}

/// Runs `dsa-verify ARGS` and expects exit status `code` and an output line holding every one
/// of `words` (the exit status and the line that says why); returns the output.
inline std::string expect_cli(const std::string& args, int code, const std::vector<std::string>& words) {
  std::string out;
  EXPECT_EQ(run_cli_capture(args, &out), code) << "dsa-verify " << args;
  EXPECT_FALSE(lines_with(out, words).empty()) << out;
  return out;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << path << " was not written";
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(in);
}

/// Writes tensors by output name as a candidate file.
inline void write_outputs(const std::string& path, const std::map<std::string, Tensor>& outputs) {
  fixtures::SafetensorsFile f;
  for (const auto& [n, t] : outputs) f.tensors.emplace(n, t);
  fixtures::write_safetensors(path, f);
}

/// Path of the mutant plugin built from props::mutant_subjects()[i] (DSA_MUTANT_PLUGINS).
inline std::string mutant_plugin(size_t i) {
  std::stringstream all(DSA_MUTANT_PLUGINS);
  std::string p;
  for (size_t k = 0; std::getline(all, p, '|'); ++k)
    if (k == i) return p;
  return "";
}

/// Path of the golden fixture `name` shipped in fixtures/golden (DSA_GOLDEN_FIXTURE_DIR).
inline std::string golden(const std::string& name) {
  return std::string(DSA_GOLDEN_FIXTURE_DIR) + "/" + name + ".safetensors";
}

/// The whole text of the file at `path` ("" when it cannot be read).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The plugin library of the mutant named `name` (props::mutant_subjects order), or "".
inline std::string mutant_plugin_named(const std::string& name) {
  const std::vector<props::Subject> all = props::mutant_subjects();
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == name) return mutant_plugin(i);
  return "";
}

}  // namespace dsa::cli::test
