// `megactx tokenize` end to end against the HF goldens: ids printed
// comma-separated, --decode printing exactly the decoded text, bad input one
// error line with exit 1. Runs the built binary (skipped when the megactx
// target has not been built in this tree).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "fixture_util.h"

namespace megactx {
namespace {

using testing::fixture_dir;
using testing::read_file;
using testing::read_json;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string binary() {
  return std::string(MEGACTX_BINARY_DIR) + "/megactx";
}

RunResult run(const std::string& arguments) {
  const auto scratch = std::filesystem::temp_directory_path() /
                       ("megactx_tokenize_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  const std::string out = (scratch / "out").string(), err = (scratch / "err").string();
  const int status = std::system((binary() + " " + arguments + " >" + out + " 2>" + err).c_str());
  RunResult result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(out), read_file(err)};
  std::filesystem::remove_all(scratch);
  return result;
}

class TokenizeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(binary())) GTEST_SKIP() << binary() << " not built";
  }
};

std::string join(const std::vector<int>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  return line;
}

TEST_F(TokenizeCliTest, EncodesAndDecodesLikeHf) {
  const auto golden = read_json(fixture_dir("glm") + "/golden.json");
  const auto text_file = std::filesystem::temp_directory_path() / "megactx_tokenize_cli_text";
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"];
    if (text.empty() || text.find('\0') != std::string::npos || ++checked > 40) continue;
    std::ofstream(text_file, std::ios::binary) << text;
    const auto ids = c["ids"].get<std::vector<int>>();
    RunResult r =
        run("tokenize --model " + fixture_dir("glm") + " --text-file " + text_file.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, join(ids) + "\n") << text;
    r = run("tokenize --model " + fixture_dir("glm") + " --decode " + join(ids));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, c["decoded"].get<std::string>());
  }
  std::filesystem::remove(text_file);
  // --text and the post-processor ([gMASK] <sop>).
  const RunResult r = run("tokenize --model " + fixture_dir("glm") +
                          " --add-special-tokens --text '[gMASK]<sop><|user|>'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1802,1804,1802,1804,1807\n");
}

TEST_F(TokenizeCliTest, BadInputIsOneErrorLine) {
  for (const std::string& arguments :
       {"tokenize --model " + fixture_dir("glm") + " --decode 1,x",
        "tokenize --model " + fixture_dir("glm") + " --decode 99999999",
        "tokenize --model " + fixture_dir("no_such_model") + " --text hi",
        "tokenize --model " + fixture_dir("glm")}) {
    const RunResult r = run(arguments);
    EXPECT_EQ(r.exit_code, 1) << arguments;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace
}  // namespace megactx
