#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

namespace dsa::cli {

std::string partial_note(const CaseResult& c) {
  if (c.status != "pass" || c.not_judged.empty()) return "";
  std::string s = "partial: ";
  for (size_t i = 0; i < c.not_judged.size(); ++i) s += (i ? ", " : "") + c.not_judged[i];
  return s + " not judged";
}

CaseResult make_case(std::string op, std::string property, std::string status) {
  CaseResult c;
  c.op = std::move(op);
  c.property = std::move(property);
  c.status = std::move(status);
  return c;
}

Progress::Progress(size_t total)
    : total_(total), tty_(isatty(fileno(stderr)) != 0), start_(std::chrono::steady_clock::now()) {}

void Progress::update(const CaseResult& c) {
  ++done_;
  if (c.status == "fail") ++failed_;
  std::string partial = partial_note(c);
  if (!partial.empty()) ++partial_;
  // A pass beside ops that did not run says which (never a plain pass for them).
  if (c.status == "pass" && c.message.rfind("skip: ", 0) == 0)
    partial += (partial.empty() ? "" : "; ") + c.message;
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    const int width = 30;
    int filled = total_ ? static_cast<int>(width * done_ / total_) : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu cases, %zu failed, %zu partial, %.1fs  %-40.40s",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done_,
                 total_, failed_, partial_, secs, (c.op + " " + c.property).c_str());
  } else {
    // "[3/9] pass sparse_mla_fwd property:x (partial: max_logits not judged) (0.4s)"
    std::fprintf(stderr, "[%zu/%zu] %-4s %s %s%s (%.1fs)\n", done_, total_, c.status.c_str(),
                 c.op.c_str(), c.property.c_str(), partial.empty() ? "" : (" (" + partial + ")").c_str(),
                 secs);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_) std::fprintf(stderr, "\n");
}

void print_summary(std::FILE* out, const std::string& backend, const std::vector<CaseResult>& cases) {
  size_t pass = 0, partial = 0, fail = 0, skip = 0, interrupted = 0;
  std::fprintf(out, "\ndsa-verify audit: backend %s\n", backend.c_str());
  // err/base: worst max|c - r| / the fp32 baseline's error (SPEC §9 "measured ratio");
  // err/bound: worst |c - r| / the element's bound (> 1 fails). "-": not measured (properties).
  // "nonfinite": NaN/±inf where the reference differs (no finite error; the FAIL's message
  // below counts them and names the first), never the 0 measured over the other positions.
  std::fprintf(out, "%-24s %-44s %-7s %9s %9s %7s\n", "op", "property", "result", "err/base",
               "err/bound", "cases");
  for (const auto& c : cases) {
    char ratio[32] = "-", over[32] = "-";
    if (c.has_ratio) {
      std::snprintf(ratio, sizeof ratio, "%.3g", c.worst_ratio);
      std::snprintf(over, sizeof over, "%.3g", c.worst_err_over_bound);
    }
    if (c.nonfinite_mismatches > 0) {
      std::snprintf(ratio, sizeof ratio, "%s", "nonfinite");
      std::snprintf(over, sizeof over, "%s", "nonfinite");
    }
    const bool is_partial = !partial_note(c).empty();
    std::fprintf(out, "%-24s %-44s %-7s %9s %9s %7lld\n", c.op.c_str(), c.property.c_str(),
                 is_partial ? "partial" : c.status.c_str(), ratio, over, static_cast<long long>(c.cases));
    (c.status == "pass" ? pass : c.status == "fail" ? fail : c.status == "interrupted" ? interrupted : skip)++;
    partial += is_partial;
  }
  for (const auto& c : cases) {
    if (c.status == "skip" && !c.message.empty())
      std::fprintf(out, "skipped %s %s: %s\n", c.op.c_str(), c.property.c_str(), c.message.c_str());
  }
  // A pass on the draws the backend supports: how many it declined (redrawn) and why.
  for (const auto& c : cases)
    if (c.status == "pass" && c.message.rfind("declined ", 0) == 0)
      std::fprintf(out, "pass %s %s (%s)\n", c.op.c_str(), c.property.c_str(), c.message.c_str());
  for (const auto& c : cases) {
    const std::string note = partial_note(c);
    if (!note.empty())  // "partial OP PROPERTY: max_logits not judged"
      std::fprintf(out, "partial %s %s: %s\n", c.op.c_str(), c.property.c_str(), note.substr(9).c_str());
  }
  for (const auto& c : cases) {
    if (c.status != "fail" && c.status != "interrupted") continue;
    std::fprintf(out, "\n%s %s %s\n  %s\n", c.status == "fail" ? "FAIL" : "INTERRUPTED", c.op.c_str(),
                 c.property.c_str(), c.message.c_str());
    if (!c.repro.empty()) std::fprintf(out, "  reproduce: %s\n", c.repro.c_str());
    if (!c.fixture.empty()) std::fprintf(out, "  fixture:   %s\n", c.fixture.c_str());
  }
  if (pass == 0 && fail == 0 && interrupted == 0)
    std::fprintf(out, "\nerror: no case ran (every op was skipped: see the reasons above)\n");
  std::fprintf(out, "\naudit: %zu passed", pass);
  if (partial) std::fprintf(out, " (%zu partial: some outputs not judged)", partial);
  std::fprintf(out, ", %zu failed", fail);
  // Failures that are declined SPEC-mandatory cases, not wrong values (props::run_property).
  const size_t incomplete = static_cast<size_t>(std::count_if(cases.begin(), cases.end(), [](const CaseResult& c) {
    return c.status == "fail" && c.message.rfind("INCOMPLETE: backend declined", 0) == 0;
  }));
  if (incomplete) std::fprintf(out, " (%zu INCOMPLETE: backend declined mandatory cases)", incomplete);
  std::fprintf(out, ", %zu skipped", skip);
  std::fprintf(out, interrupted ? ", %zu interrupted\n" : "\n", interrupted);
}

nlohmann::json to_json(const std::string& backend, const std::vector<CaseResult>& cases) {
  nlohmann::json j;
  j["format"] = "dsa-verify-audit/1";
  j["backend"] = backend;
  j["contract_version"] = DSA_CONTRACT_VERSION;
  nlohmann::json arr = nlohmann::json::array();
  size_t pass = 0, partial = 0, fail = 0, skip = 0, interrupted = 0;
  for (const auto& c : cases) {
    const std::string note = partial_note(c);
    arr.push_back({{"op", c.op}, {"property", c.property}, {"status", c.status},
                   {"partial", !note.empty()}, {"not_judged", c.not_judged},
                   {"worst_ratio", c.has_ratio ? nlohmann::json(c.worst_ratio) : nlohmann::json(nullptr)},
                   {"worst_err_over_bound", c.has_ratio ? nlohmann::json(c.worst_err_over_bound) : nlohmann::json(nullptr)},
                   {"nonfinite_mismatches", c.nonfinite_mismatches},
                   {"cases", c.cases}, {"message", c.message},
                   {"repro", c.repro}, {"fixture", c.fixture}, {"seconds", c.seconds}});
    (c.status == "pass" ? pass : c.status == "fail" ? fail : c.status == "interrupted" ? interrupted : skip)++;
    partial += !note.empty();
  }
  j["cases"] = arr;
  j["summary"] = {{"passed", pass}, {"partial", partial}, {"failed", fail}, {"skipped", skip},
                  {"interrupted", interrupted}};
  return j;
}

static std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters; replace them.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\n' && ch != '\t') o += ' ';
        else o += ch;
    }
  }
  return o;
}

std::string to_junit(const std::string& backend, const std::vector<CaseResult>& cases) {
  std::map<std::string, std::vector<const CaseResult*>> by_op;
  for (const auto& c : cases) by_op[c.op].push_back(&c);
  size_t total_fail = 0, total_skip = 0, total_error = 0;
  double total_time = 0;
  for (const auto& c : cases) {
    total_fail += c.status == "fail";
    total_skip += c.status == "skip";
    total_error += c.status == "interrupted";
    total_time += c.seconds;
  }
  std::string x = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  x += "<testsuites name=\"dsa-verify audit " + xml_escape(backend) + "\" tests=\"" +
       std::to_string(cases.size()) + "\" failures=\"" + std::to_string(total_fail) +
       "\" errors=\"" + std::to_string(total_error) + "\" skipped=\"" + std::to_string(total_skip) + "\" time=\"" +
       std::to_string(total_time) + "\">\n";
  for (const auto& [op, list] : by_op) {
    size_t f = 0, s = 0, e = 0;
    double t = 0;
    for (auto* c : list) { f += c->status == "fail"; s += c->status == "skip"; e += c->status == "interrupted"; t += c->seconds; }
    x += "  <testsuite name=\"" + xml_escape(backend + "." + op) + "\" tests=\"" +
         std::to_string(list.size()) + "\" failures=\"" + std::to_string(f) +
         "\" errors=\"" + std::to_string(e) + "\" skipped=\"" + std::to_string(s) + "\" time=\"" + std::to_string(t) + "\">\n";
    for (auto* c : list) {
      // A partial pass says so in its name (what a CI page lists) and in its system-out.
      const std::string note = partial_note(*c);
      x += "    <testcase classname=\"" + xml_escape(backend + "." + op) + "\" name=\"" +
           xml_escape(c->property + (note.empty() ? "" : " [" + note + "]")) + "\" time=\"" +
           std::to_string(c->seconds) + "\"";
      if (c->status == "pass" && note.empty()) { x += "/>\n"; continue; }
      x += ">\n";
      if (!note.empty()) x += "      <system-out>" + xml_escape(note) + "</system-out>\n";
      if (c->status == "fail") {
        std::string body = c->message;
        if (!c->repro.empty()) body += "\nreproduce: " + c->repro;
        if (!c->fixture.empty()) body += "\nfixture: " + c->fixture;
        x += "      <failure message=\"" + xml_escape(c->message.substr(0, 200)) +
             "\" type=\"oracle\">" + xml_escape(body) + "</failure>\n";
      } else if (c->status == "interrupted") {  // no verdict: a JUnit error, not a failure
        x += "      <error message=\"" + xml_escape(c->message.substr(0, 200)) +
             "\" type=\"interrupted\">" + xml_escape(c->message) + "</error>\n";
      } else if (c->status != "pass") {
        x += "      <skipped message=\"" + xml_escape(c->message) + "\"/>\n";
      }
      x += "    </testcase>\n";
    }
    x += "  </testsuite>\n";
  }
  x += "</testsuites>\n";
  return x;
}

void write_text_file(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) {  // /dev/stdout, a pipe: written in place
    std::ofstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error(path + ": cannot open for writing");
    f << text;
    if (!f) throw std::runtime_error(path + ": write failed");
    return;
  }
  // A temporary file beside it, renamed over it: `path` holds the whole previous text or the
  // whole new one, never a truncated one, whatever stops the process (fresh12 F5).
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + "." +
                                               std::to_string(static_cast<long>(::getpid())) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(path + ": cannot open for writing");
    f << text;
    f.flush();
    if (!f) {
      fs::remove(tmp, ec);
      throw std::runtime_error(path + ": write failed");
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw std::runtime_error(path + ": cannot write (" + ec.message() + ")");
  }
}

}  // namespace dsa::cli
