// `dsa-verify fixtures check`, `fixtures generate`, `replay` and `backends`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "dsa/fixtures/fixture.h"
#include "dsa/fixtures/manifest.h"
#include "dsa/oracle/fixture_check.h"
#include "dsa/plugin/plugin_backend.h"

#if __has_include("dsa/fixtures/generate.h")
#include "dsa/fixtures/generate.h"
#define DSA_HAVE_GENERATOR 1
#endif

namespace fs = std::filesystem;

namespace dsa::cli {

FixtureDirs default_fixture_dirs() {
  const char* env = std::getenv("DSA_FIXTURES_DIR");
  std::string root = env ? env : DSA_SOURCE_FIXTURES_DIR;
  return FixtureDirs{root + "/golden", root + "/peer"};
}

int run_list_backends() {
  for (const auto& name : oracle::backend_names()) {
    auto b = oracle::make_backend(name);
    std::string why = b->unavailable_reason();
    std::printf("%-16s %s\n", name.c_str(), why.empty() ? "available" : ("unavailable: " + why).c_str());
  }
  return kExitOk;
}

// Checks MANIFEST (ours) or SHA256SUMS (`sha256sum` format) of `dir`; returns problems.
static std::vector<std::string> verify_checksums(const std::string& dir) {
  if (fs::exists(fs::path(dir) / fixtures::kManifestName)) return fixtures::verify_manifest(dir);
  std::vector<std::string> problems;
  fs::path sums = fs::path(dir) / "SHA256SUMS";
  if (!fs::exists(sums)) return {dir + ": no MANIFEST or SHA256SUMS; checksums not verified"};
  std::ifstream in(sums);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line);
    std::string sha, file;
    ls >> sha >> file;
    if (!file.empty() && file[0] == '*') file = file.substr(1);
    fs::path p = fs::path(dir) / file;
    if (!fs::exists(p)) { problems.push_back(file + ": listed in SHA256SUMS but missing"); continue; }
    if (fixtures::sha256_file(p.string()) != sha) problems.push_back(file + ": sha256 differs from SHA256SUMS");
  }
  return problems;
}

static std::vector<std::string> fixture_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

int run_fixtures_check(const std::string& dir, const std::vector<std::string>& backend_names,
                       bool verbose) {
  int code = kExitOk;
  std::vector<std::string> problems = verify_checksums(dir);
  for (const auto& p : problems) std::printf("checksum: %s\n", p.c_str());
  if (!problems.empty() && problems[0].find("not verified") == std::string::npos) code = kExitUsage;

  std::vector<std::unique_ptr<oracle::Backend>> backends;
  std::vector<std::string> names = backend_names.empty() ? oracle::backend_names() : backend_names;
  for (const auto& n : names) {
    auto b = oracle::make_backend(n);
    std::string why = b->unavailable_reason();
    if (!why.empty()) { std::printf("backend %s skipped: %s\n", n.c_str(), why.c_str()); continue; }
    backends.push_back(std::move(b));
  }

  size_t pass = 0, fail = 0;
  std::vector<std::string> summary;
  const std::vector<std::string> files = fixture_files(dir);
  if (files.empty()) throw std::invalid_argument("fixtures check: " + dir + " holds no .safetensors fixtures");
  for (const auto& file : files) {
    fixtures::Fixture f;
    try {
      f = fixtures::load_fixture(file);
    } catch (const fixtures::FileError& e) {
      std::printf("error: %s\n", e.what());
      code = kExitUsage;
      continue;
    }
    for (auto& b : backends) {
      oracle::FixtureReport r;
      try {
        r = oracle::check_fixture(f, b.get());
      } catch (const std::exception& e) {
        std::printf("error: %s: %s\n", file.c_str(), e.what());
        code = kExitUsage;
        continue;
      }
      bool ok = r.passed();
      (ok ? pass : fail)++;
      if (!ok && code == kExitOk) code = kExitDisagree;
      if (verbose || !ok) std::printf("%s\n", oracle::format_fixture_report(r).c_str());
      char line[256];
      std::snprintf(line, sizeof line, "%-28s %-20s %-16s %s", f.case_name.c_str(), f.op.c_str(),
                    b->name().c_str(), ok ? "agree" : "DISAGREE");
      summary.push_back(line);
    }
  }
  std::printf("\nfixtures check %s\n%-28s %-20s %-16s %s\n", dir.c_str(), "case", "op", "backend", "result");
  for (const auto& s : summary) std::printf("%s\n", s.c_str());
  std::printf("\nfixtures: %zu passed, %zu failed\n", pass, fail);
  return code;
}

int run_fixtures_generate(const std::string& preset, const std::string& out_dir) {
#ifdef DSA_HAVE_GENERATOR
  fixtures::generate_preset(preset, out_dir);
  std::printf("fixtures generate: preset %s written to %s\n", preset.c_str(), out_dir.c_str());
  return kExitOk;
#else
  std::fprintf(stderr, "dsa-verify: fixtures generate is not built in this configuration\n");
  return kExitUsage;
#endif
}

int run_replay(const std::string& file, const std::string& backend_arg, const std::string& plugin_path) {
  fixtures::Fixture f = fixtures::load_fixture(file);
  const std::string backend_name = plugin_path.empty() ? backend_arg : plugin::register_plugin(plugin_path);
  auto b = oracle::make_backend(backend_name);
  std::string why = b->unavailable_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "dsa-verify: backend %s unavailable: %s\n", backend_name.c_str(), why.c_str());
    return kExitUsage;
  }
  oracle::FixtureReport r = oracle::check_fixture(f, b.get());
  std::printf("%s\n", oracle::format_fixture_report(r).c_str());
  return r.passed() ? kExitOk : kExitDisagree;
}

}  // namespace dsa::cli
