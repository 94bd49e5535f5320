// Renders every conversation of tests/fixtures/chat/requests with the real
// GLM-4.6 and DeepSeek-V3.2 templates (tests/fixtures/chat/model_templates,
// as their model repositories ship them) and the templates of
// tests/fixtures/chat/templates, and compares byte for byte with the
// reference renderer (tools/fixtures/render_chat_template.py run by Debian's
// /usr/bin/python3 with python3-jinja2, set up as HF's apply_chat_template). When the reference
// fails on a conversation, megactx must fail with an Error too.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chat/chat_template.h"
#include "core/error.h"

namespace megactx {
namespace {

namespace fs = std::filesystem;

const char* kPython = "/usr/bin/python3";

fs::path source_dir() {
  return fs::path(MEGACTX_SOURCE_DIR);
}

fs::path model_templates() {
  return source_dir() / "tests/fixtures/chat/model_templates";
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

struct Reference {
  bool ok;
  std::string output;
};

Reference run_reference(const fs::path& script, const fs::path& template_path,
                        const fs::path& request) {
  std::string command = std::string(kPython) + " " + quote(script.string()) + " " +
                        quote(template_path.string()) + " " + quote(request.string()) +
                        " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {false, ""};
  std::string output;
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) && WEXITSTATUS(status) == 0, output};
}

std::vector<fs::path> files_in(const fs::path& dir, const std::string& extension) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == extension) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

class ChatReference : public ::testing::Test {
 protected:
  void SetUp() override {
    script_ = source_dir() / "tools/fixtures/render_chat_template.py";
    std::string probe = std::string(kPython) + " -c 'import jinja2' 2>/dev/null";
    if (std::system(probe.c_str()) != 0)
      GTEST_SKIP() << kPython << " cannot import jinja2 (apt-get install python3-jinja2)";
  }

  // Compares every request against one template; returns the number compared.
  int compare_all(const fs::path& template_path) {
    EXPECT_TRUE(fs::exists(template_path)) << template_path;
    ChatTemplate chat_template(read_file(template_path));
    int compared = 0;
    for (const fs::path& request_path :
         files_in(source_dir() / "tests/fixtures/chat/requests", ".json")) {
      SCOPED_TRACE(template_path.filename().string() + " x " + request_path.filename().string());
      Reference reference = run_reference(script_, template_path, request_path);
      auto request = nlohmann::ordered_json::parse(read_file(request_path));
      auto context = chat_template_context(request, nlohmann::ordered_json::object());
      if (!reference.ok) {
        EXPECT_THROW(chat_template.render(context), Error)
            << "the reference failed on this request";
      } else {
        try {
          EXPECT_EQ(chat_template.render(context), reference.output);
        } catch (const Error& error) {
          ADD_FAILURE() << "megactx threw: " << error.what();
        }
      }
      ++compared;
    }
    return compared;
  }

  fs::path script_;
};

TEST_F(ChatReference, Glm46) {
  EXPECT_GE(compare_all(model_templates() / "GLM-4.6.jinja"), 10);
}

TEST_F(ChatReference, DeepSeekV32) {
  EXPECT_GE(compare_all(model_templates() / "DeepSeek-V3.2.jinja"), 10);
}

TEST_F(ChatReference, TemplatesLikeThem) {
  auto templates = files_in(source_dir() / "tests/fixtures/chat/templates", ".jinja");
  ASSERT_GE(templates.size(), 3u);
  for (const auto& path : templates) compare_all(path);
}

}  // namespace
}  // namespace megactx
