// The incremental output parser: a small state machine over the generated
// text (reasoning -> content <-> tool-call block).
//
// Streaming rules, chosen so that the concatenated deltas never depend on how
// the text was cut into pieces (the tests check every cut):
//  * text that could still become a marker ("<tool_", "</thi") is held back,
//    and so is the whitespace right before it;
//  * `<think>` opens reasoning only before any content (leading whitespace
//    allowed); `</think>` closes it; unterminated reasoning stays reasoning;
//  * a tool-call block (GLM `<tool_call>...</tool_call>`, DeepSeek
//    `<｜DSML｜function_calls>...</｜DSML｜function_calls>`) is buffered until
//    its end marker, then parsed as a whole: a well-formed block becomes
//    tool-call deltas (the call's id and name first, then its arguments piece
//    by piece); a malformed or unterminated one is emitted as content, exactly
//    as written, so nothing is ever dropped;
//  * whitespace between content and a tool call, between calls, and at the
//    start of content after `</think>` or a call is dropped.
#include "chat/output_parser.h"

#include <random>

#include "chat/tool_call_parser_common.h"

namespace megactx {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t length = longest; length > 0; --length)
    if (marker.starts_with(text.substr(text.size() - length))) return length;
  return 0;
}

// `text` without the tool-call markup of `format`: GLM's six markers, every
// DSML tag (`<｜DSML｜name ...>` and `</｜DSML｜name>`, attributes included).
std::string strip_markup(std::string_view text, ToolCallFormat format) {
  std::string out;
  if (format == ToolCallFormat::Glm) {
    static constexpr std::string_view kMarkers[] = {"<tool_call>", "</tool_call>", "<arg_key>",
                                                    "</arg_key>",  "<arg_value>",  "</arg_value>"};
    size_t at = 0;
    while (at < text.size()) {
      bool matched = false;
      for (std::string_view m : kMarkers) {
        if (text.substr(at, m.size()) == m) {
          at += m.size();
          matched = true;
          break;
        }
      }
      if (!matched) out += text[at++];
    }
    return out;
  }
  static constexpr std::string_view kDsml =
      "\xEF\xBD\x9C"
      "DSML"
      "\xEF\xBD\x9C";
  size_t at = 0;
  while (at < text.size()) {
    const bool open = text.substr(at, 1 + kDsml.size()) == std::string("<") + std::string(kDsml);
    const bool close = text.substr(at, 2 + kDsml.size()) == std::string("</") + std::string(kDsml);
    if (open || close) {
      const size_t end = text.find('>', at);
      if (end == std::string_view::npos) break;  // a cut-off tag: nothing of it remains
      at = end + 1;
      continue;
    }
    out += text[at++];
  }
  return out;
}

size_t trailing_space(std::string_view text) {
  size_t count = 0;
  while (count < text.size() && tool_calls::is_space(text[text.size() - 1 - count])) ++count;
  return count;
}

}  // namespace

struct OutputParser::Impl {
  enum class Mode { Content, Reasoning, ToolBlock };

  OutputParserOptions options;
  tool_calls::ToolSchemas schemas;
  std::string_view block_start, block_end;
  Mode mode = Mode::Content;
  std::string buffer;            // text received and not yet emitted
  bool content_started = false;  // after this, <think> is ordinary text
  bool skip_leading_space = false;
  std::string pending_space;  // dropped before a block; restored if the block is malformed
  int next_index = 0;
  std::mt19937_64 id_generator;

  explicit Impl(OutputParserOptions opts)
      : options(std::move(opts)),
        schemas(options.tools, options.known_tools_only),
        id_generator(options.tool_call_id_seed != 0 ? options.tool_call_id_seed
                                                    : std::random_device{}()) {
    const bool glm = options.format == ToolCallFormat::Glm;
    block_start = glm ? tool_calls::kGlmStart : tool_calls::kDsmlStart;
    block_end = glm ? tool_calls::kGlmEnd : tool_calls::kDsmlEnd;
    if (options.parse_reasoning && options.starts_in_reasoning) {
      mode = Mode::Reasoning;
      content_started = true;
    }
    if (!options.parse_reasoning) content_started = true;
  }

  std::string new_id() {
    static constexpr char kAlphabet[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlphabet[id_generator() % (sizeof(kAlphabet) - 1)];
    return id;
  }

  void emit_content(std::string_view text, ParsedDelta& out) {
    if (skip_leading_space) {
      while (!text.empty() && tool_calls::is_space(text.front())) text.remove_prefix(1);
      if (text.empty()) return;
      skip_leading_space = false;
    }
    if (text.empty()) return;
    content_started = true;
    out.content.append(text);
  }

  // A block that did not parse: the text exactly as written.
  void emit_verbatim(std::string_view text, ParsedDelta& out) {
    content_started = true;
    skip_leading_space = false;
    out.content += pending_space;
    pending_space.clear();
    if (options.strip_unparsed_markup)
      out.content += strip_markup(text, options.format);
    else
      out.content.append(text);
  }

  void emit_calls(const std::vector<tool_calls::ParsedCall>& calls, ParsedDelta& out) {
    for (const auto& call : calls) {
      // Past the request's limit (parallel_tool_calls false) a call is
      // dropped whole, markup included, as vLLM drops it.
      if (options.max_tool_calls > 0 && next_index >= options.max_tool_calls) break;
      const int index = next_index++;
      out.tool_calls.push_back({index, new_id(), call.name, ""});
      for (auto& piece : tool_calls::argument_pieces(call))
        out.tool_calls.push_back({index, "", "", std::move(piece)});
    }
    pending_space.clear();
    skip_leading_space = true;
  }

  // Where `<think>` opens reasoning in the buffer, if it does (only whitespace before it).
  size_t think_position() const {
    if (content_started) return std::string::npos;
    const size_t at = buffer.find(kThinkOpen);
    if (at == std::string::npos || !tool_calls::all_space(std::string_view(buffer).substr(0, at)))
      return std::string::npos;
    return at;
  }

  // Returns false when it needs more text.
  bool step_content(bool final, ParsedDelta& out) {
    const size_t think = think_position();
    const size_t tool = options.parse_tool_calls ? buffer.find(block_start) : std::string::npos;
    if (think != std::string::npos && think < tool) {
      buffer.erase(0, think + kThinkOpen.size());
      mode = Mode::Reasoning;
      content_started = true;
      return true;
    }
    if (tool != std::string::npos) {
      std::string_view before(buffer.data(), tool);
      const size_t space = trailing_space(before);
      if (skip_leading_space && space == before.size()) {
        pending_space = std::string(before);  // between two blocks: dropped unless the next is bad
      } else {
        emit_content(before.substr(0, before.size() - space), out);
        pending_space = std::string(before.substr(before.size() - space));
      }
      buffer.erase(0, tool);
      mode = Mode::ToolBlock;
      return true;
    }
    if (final) {
      emit_content(buffer, out);
      buffer.clear();
      return false;
    }
    // Hold back a possible marker start and the whitespace before it.
    std::string_view view(buffer);
    size_t hold = 0;
    if (options.parse_tool_calls) hold = partial_marker_suffix(view, block_start);
    if (!content_started) {
      hold = std::max(hold, partial_marker_suffix(view, kThinkOpen));
      if (tool_calls::all_space(view)) hold = view.size();
    }
    hold += trailing_space(view.substr(0, view.size() - hold));
    emit_content(view.substr(0, view.size() - hold), out);
    buffer.erase(0, buffer.size() - hold);
    return false;
  }

  bool step_reasoning(bool final, ParsedDelta& out) {
    const size_t close = buffer.find(kThinkClose);
    if (close != std::string::npos) {
      out.reasoning_content.append(buffer, 0, close);
      buffer.erase(0, close + kThinkClose.size());
      mode = Mode::Content;
      skip_leading_space = true;
      return true;
    }
    const size_t hold = final ? 0 : partial_marker_suffix(buffer, kThinkClose);
    out.reasoning_content.append(buffer, 0, buffer.size() - hold);
    buffer.erase(0, buffer.size() - hold);
    return false;
  }

  bool step_block(bool final, ParsedDelta& out) {
    // buffer starts with block_start.
    const size_t end = buffer.find(block_end, block_start.size());
    const size_t restart = buffer.find(block_start, block_start.size());
    if (restart != std::string::npos && (end == std::string::npos || restart < end)) {
      // A new block opens before this one closed: this one is malformed text.
      emit_verbatim(std::string_view(buffer).substr(0, restart), out);
      buffer.erase(0, restart);
      return true;
    }
    if (end != std::string::npos) {
      const size_t length = end + block_end.size();
      const std::string_view block(buffer.data(), length);
      const auto calls = options.format == ToolCallFormat::Glm
                             ? tool_calls::parse_glm_block(block, schemas)
                             : tool_calls::parse_dsml_block(block, schemas);
      if (calls)
        emit_calls(*calls, out);
      else
        emit_verbatim(block, out);
      buffer.erase(0, length);
      mode = Mode::Content;
      return true;
    }
    if (final) {
      emit_verbatim(buffer, out);
      buffer.clear();
      mode = Mode::Content;
    }
    return false;
  }

  ParsedDelta process(bool final) {
    ParsedDelta out;
    bool progress = true;
    while (progress) {
      switch (mode) {
        case Mode::Content:
          progress = step_content(final, out);
          break;
        case Mode::Reasoning:
          progress = step_reasoning(final, out);
          break;
        case Mode::ToolBlock:
          progress = step_block(final, out);
          break;
      }
    }
    return out;
  }
};

OutputParser::OutputParser(OutputParserOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

OutputParser::~OutputParser() = default;

ParsedDelta OutputParser::push(std::string_view text) {
  impl_->buffer.append(text);
  return impl_->process(false);
}

ParsedDelta OutputParser::finish() {
  return impl_->process(true);
}

ParsedMessage parse_output(std::string_view text, const OutputParserOptions& options) {
  OutputParser parser(options);
  ParsedMessage message;
  auto absorb = [&message](const ParsedDelta& delta) {
    message.content += delta.content;
    message.reasoning_content += delta.reasoning_content;
    for (const auto& call : delta.tool_calls) {
      auto& calls = message.tool_calls;
      if (call.index >= static_cast<int>(calls.size()))
        calls.push_back({{"id", call.id},
                         {"type", "function"},
                         {"function", {{"name", call.name}, {"arguments", ""}}}});
      auto& arguments = calls[static_cast<size_t>(call.index)]["function"]["arguments"];
      arguments = arguments.get<std::string>() + call.arguments;
    }
  };
  absorb(parser.push(text));
  absorb(parser.finish());
  return message;
}

}  // namespace megactx
