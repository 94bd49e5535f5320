#include "grammar/json_builder.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace megactx::grammar {

namespace {

constexpr int kMaxAnyOrderProperties = 10;
constexpr int64_t kMaxCountedItems = 10'000;

// Decodes UTF-8 (valid: it comes from a JSON parser) into code points.
std::vector<uint32_t> code_points_of(std::string_view text) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    int length = b0 < 0x80 ? 1 : b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
    uint32_t cp = length == 1 ? b0 : b0 & (0xFF >> (length + 1));
    for (int k = 1; k < length && i + k < text.size(); ++k) {
      cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += length;
  }
  return out;
}

}  // namespace

JsonBuilder::JsonBuilder(Grammar& grammar, const JsonSchemaOptions& options)
    : g_(grammar), options_(options) {}

int32_t JsonBuilder::rule(const std::string& name, int32_t& slot) {
  if (slot < 0) slot = g_.add_rule(g_.find_rule(name) < 0 ? name : g_.fresh_name(name));
  return slot;
}

ExprId JsonBuilder::bracketed(char open, ExprId items, bool may_be_empty, char close) {
  const ExprId inside = g_.seq({items, ws()});
  return g_.seq({g_.byte(static_cast<uint8_t>(open)), ws(),
                 may_be_empty ? g_.optional(inside) : inside,
                 g_.byte(static_cast<uint8_t>(close))});
}

ExprId JsonBuilder::ws() {
  if (ws_ >= 0) return ws_;
  if (!options_.any_whitespace) {
    ws_ = g_.empty();
  } else {
    const ExprId space = g_.bytes({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}});
    ws_ = g_.repeat(space, 0, options_.max_whitespace);
  }
  return ws_;
}

ExprId JsonBuilder::item_separator() {
  if (!options_.any_whitespace) return g_.literal(options_.item_separator);
  return g_.seq({ws(), g_.byte(','), ws()});
}

ExprId JsonBuilder::key_separator() {
  if (!options_.any_whitespace) return g_.literal(options_.key_separator);
  return g_.seq({ws(), g_.byte(':'), ws()});
}

ExprId JsonBuilder::string_char() {
  if (string_char_ >= 0) return string_char_;
  const ExprId literal =
      options_.escape_less_than
          ? g_.code_points({{0x20, 0x21}, {0x23, 0x3B}, {0x3D, 0x5B}, {0x5D, 0x10FFFF}})
          : g_.code_points({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}});
  const ExprId hex = g_.bytes({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
  const ExprId escape =
      g_.seq({g_.byte('\\'), g_.alt({g_.bytes({{'"', '"'},
                                               {'\\', '\\'},
                                               {'/', '/'},
                                               {'b', 'b'},
                                               {'f', 'f'},
                                               {'n', 'n'},
                                               {'r', 'r'},
                                               {'t', 't'}}),
                                     g_.seq({g_.byte('u'), hex, hex, hex, hex})})});
  string_char_ = g_.alt({literal, escape});
  return string_char_;
}

ExprId JsonBuilder::canonical_chars(const std::vector<CodeRange>& input) {
  const std::vector<CodeRange> ranges = normalize_ranges(input);
  auto contains = [&](uint32_t cp) {
    for (const CodeRange& r : ranges) {
      if (r.lo <= cp && cp <= r.hi) return true;
    }
    return false;
  };
  std::vector<CodeRange> literal;
  // Quote, backslash and controls are written escaped (and '<' with escape_less_than).
  const std::vector<CodeRange> unescaped =
      options_.escape_less_than
          ? std::vector<CodeRange>{{0x20, 0x21}, {0x23, 0x3B}, {0x3D, 0x5B}, {0x5D, 0x10FFFF}}
          : std::vector<CodeRange>{{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
  for (const CodeRange& r : ranges) {
    for (CodeRange part : unescaped) {
      const uint32_t lo = std::max(part.lo, r.lo);
      const uint32_t hi = std::min(part.hi, r.hi);
      if (lo <= hi) literal.push_back({lo, hi});
    }
  }
  std::vector<ExprId> options;
  if (!literal.empty()) options.push_back(g_.code_points(literal));
  static const char kHex[] = "0123456789abcdef";
  for (uint32_t cp = 0; cp < 0x20; ++cp) {
    if (!contains(cp)) continue;
    switch (cp) {
      case '\b':
        options.push_back(g_.literal("\\b"));
        break;
      case '\f':
        options.push_back(g_.literal("\\f"));
        break;
      case '\n':
        options.push_back(g_.literal("\\n"));
        break;
      case '\r':
        options.push_back(g_.literal("\\r"));
        break;
      case '\t':
        options.push_back(g_.literal("\\t"));
        break;
      default: {
        const std::string text = std::string("\\u00") + kHex[cp >> 4] + kHex[cp & 15];
        options.push_back(g_.literal(text));
      }
    }
  }
  if (options_.escape_less_than && contains('<')) options.push_back(g_.literal("\\u003c"));
  if (contains('"')) options.push_back(g_.literal("\\\""));
  if (contains('\\')) options.push_back(g_.literal("\\\\"));
  return g_.alt(std::move(options));
}

ExprId JsonBuilder::string_literal(std::string_view text) {
  // nlohmann's serializer writes exactly the canonical escapes.
  std::string quoted = nlohmann::json(std::string(text)).dump();
  if (options_.escape_less_than) {
    for (size_t at = quoted.find('<'); at != std::string::npos; at = quoted.find('<', at))
      quoted.replace(at, 1, "\\u003c");
  }
  return g_.literal(quoted);
}

ExprId JsonBuilder::string_not_in(const std::vector<std::string>& keys) {
  // A trie over the keys' code points; leaving it through any other
  // character reaches FREE, where anything may follow. Final: FREE and trie
  // nodes that end no key.
  struct TrieNode {
    std::map<uint32_t, int32_t> children;
    bool is_key = false;
  };
  std::vector<TrieNode> trie(1);
  for (const std::string& key : keys) {
    int32_t at = 0;
    for (uint32_t cp : code_points_of(key)) {
      auto it = trie[at].children.find(cp);
      if (it == trie[at].children.end()) {
        trie.emplace_back();
        const auto child = static_cast<int32_t>(trie.size() - 1);
        trie[at].children.emplace(cp, child);
        at = child;
      } else {
        at = it->second;
      }
    }
    trie[at].is_key = true;
  }
  const auto free_state = static_cast<int32_t>(trie.size());
  std::vector<GraphEdge> edges;
  std::vector<int32_t> finals = {free_state};
  const ExprId any = canonical_chars({{0, 0x10FFFF}});
  edges.push_back({free_state, free_state, any});
  for (int32_t n = 0; n < free_state; ++n) {
    if (!trie[n].is_key) finals.push_back(n);
    std::vector<CodeRange> used;
    for (const auto& [cp, child] : trie[n].children) {
      edges.push_back({n, child, canonical_chars({{cp, cp}})});
      used.push_back({cp, cp});
    }
    const std::vector<CodeRange> others = normalize_ranges(used, true);
    if (!others.empty()) edges.push_back({n, free_state, canonical_chars(others)});
  }
  const ExprId body = g_.graph(free_state + 1, 0, std::move(finals), std::move(edges));
  return g_.seq({g_.byte('"'), body, g_.byte('"')});
}

ExprId JsonBuilder::any_string() {
  if (string_rule_ < 0) {
    rule("json_string", string_rule_);
    g_.set_body(string_rule_, g_.seq({g_.byte('"'), g_.star(string_char()), g_.byte('"')}));
  }
  return g_.rule_ref(string_rule_);
}

ExprId JsonBuilder::any_integer() {
  if (integer_rule_ < 0) {
    rule("json_integer", integer_rule_);
    const ExprId digits = g_.star(g_.bytes({{'0', '9'}}));
    g_.set_body(integer_rule_,
                g_.seq({g_.optional(g_.byte('-')),
                        g_.alt({g_.byte('0'), g_.seq({g_.bytes({{'1', '9'}}), digits})})}));
  }
  return g_.rule_ref(integer_rule_);
}

ExprId JsonBuilder::any_number() {
  if (number_rule_ < 0) {
    rule("json_number", number_rule_);
    const ExprId digit = g_.bytes({{'0', '9'}});
    const ExprId integer =
        g_.seq({g_.optional(g_.byte('-')),
                g_.alt({g_.byte('0'), g_.seq({g_.bytes({{'1', '9'}}), g_.star(digit)})})});
    const ExprId fraction = g_.optional(g_.seq({g_.byte('.'), g_.plus(digit)}));
    const ExprId exponent =
        g_.optional(g_.seq({g_.bytes({{'E', 'E'}, {'e', 'e'}}),
                            g_.optional(g_.bytes({{'+', '+'}, {'-', '-'}})), g_.plus(digit)}));
    g_.set_body(number_rule_, g_.seq({integer, fraction, exponent}));
  }
  return g_.rule_ref(number_rule_);
}

ExprId JsonBuilder::boolean() {
  return g_.alt({g_.literal("true"), g_.literal("false")});
}
ExprId JsonBuilder::null() {
  return g_.literal("null");
}

ExprId JsonBuilder::any_value() {
  if (value_rule_ < 0) {
    rule("json_value", value_rule_);
    g_.set_body(value_rule_,
                g_.alt({any_object(), any_array(), any_string(), any_number(), boolean(), null()}));
  }
  return g_.rule_ref(value_rule_);
}

ExprId JsonBuilder::any_object() {
  if (object_rule_ < 0) {
    rule("json_object", object_rule_);
    const ExprId member = g_.seq({any_string(), key_separator(), any_value()});
    const ExprId members = g_.seq({member, g_.star(g_.seq({item_separator(), member}))});
    g_.set_body(object_rule_, bracketed('{', members, true, '}'));
  }
  return g_.rule_ref(object_rule_);
}

ExprId JsonBuilder::any_array() {
  if (array_rule_ < 0) {
    rule("json_array", array_rule_);
    const ExprId items = g_.seq({any_value(), g_.star(g_.seq({item_separator(), any_value()}))});
    g_.set_body(array_rule_, bracketed('[', items, true, ']'));
  }
  return g_.rule_ref(array_rule_);
}

ExprId JsonBuilder::object(const std::vector<Member>& members, ExprId extra_key, ExprId extra_value,
                           bool any_order) {
  const ExprId separator = item_separator();
  auto member_expr = [&](const Member& m, bool first) {
    return g_.seq({first ? g_.empty() : separator, m.key, key_separator(), m.value});
  };
  ExprId extra_first = -1;
  ExprId extra_next = -1;
  if (extra_key >= 0) {
    const Member extra{extra_key, extra_value, false};
    extra_first = member_expr(extra, true);
    extra_next = member_expr(extra, false);
  }
  const auto k = static_cast<int32_t>(members.size());
  std::vector<GraphEdge> edges;
  std::vector<int32_t> finals;
  int32_t num_states;
  if (!any_order) {
    // State 2 * i + e: properties before i decided, e = something written.
    num_states = 2 * (k + 1);
    for (int32_t i = 0; i < k; ++i) {
      for (int e = 0; e < 2; ++e) {
        edges.push_back({2 * i + e, 2 * (i + 1) + 1, member_expr(members[i], e == 0)});
        if (!members[i].required) edges.push_back({2 * i + e, 2 * (i + 1) + e, -1});
      }
    }
    if (extra_key >= 0) {
      edges.push_back({2 * k, 2 * k + 1, extra_first});
      edges.push_back({2 * k + 1, 2 * k + 1, extra_next});
    }
    finals = {2 * k, 2 * k + 1};
  } else {
    MEGACTX_CHECK(k <= kMaxAnyOrderProperties,
                  "any_property_order supports objects of at most {} properties (this one has {})",
                  kMaxAnyOrderProperties, k);
    // State 2 * set + e: the properties in `set` written, e = something written.
    num_states = 2 << k;
    uint32_t required = 0;
    for (int32_t i = 0; i < k; ++i) {
      if (members[i].required) required |= 1u << i;
    }
    std::vector<ExprId> first(k), next(k);
    for (int32_t i = 0; i < k; ++i) {
      first[i] = member_expr(members[i], true);
      next[i] = member_expr(members[i], false);
    }
    for (uint32_t set = 0; set < (1u << k); ++set) {
      for (int e = 0; e < 2; ++e) {
        const auto from = static_cast<int32_t>(2 * set + e);
        if (e == 0 && set != 0) continue;  // unreachable
        for (int32_t i = 0; i < k; ++i) {
          if (set & (1u << i)) continue;
          edges.push_back(
              {from, static_cast<int32_t>(2 * (set | (1u << i)) + 1), e == 0 ? first[i] : next[i]});
        }
        if (extra_key >= 0) {
          edges.push_back(
              {from, static_cast<int32_t>(2 * set + 1), e == 0 ? extra_first : extra_next});
        }
        if ((set & required) == required) finals.push_back(from);
      }
    }
  }
  if (finals.empty()) return g_.nothing();
  // Odd states have written a member, even ones nothing: the body as
  // written members; the object may be empty when no member is required
  // (an even final can be unreachable otherwise).
  std::vector<int32_t> written;
  for (int32_t f : finals) {
    if (f % 2 == 1) written.push_back(f);
  }
  const bool may_be_empty =
      std::none_of(members.begin(), members.end(), [](const Member& m) { return m.required; });
  if (written.empty()) return g_.seq({g_.byte('{'), ws(), g_.byte('}')});
  const ExprId body = g_.graph(num_states, 0, std::move(written), std::move(edges));
  return bracketed('{', body, may_be_empty, '}');
}

ExprId JsonBuilder::array(const std::vector<ExprId>& prefix, ExprId rest, int64_t min_items,
                          int64_t max_items) {
  const auto k = static_cast<int64_t>(prefix.size());
  const int64_t max_possible = rest < 0 ? k : -1;
  int64_t max = max_items;
  if (max_possible >= 0 && (max < 0 || max > max_possible)) max = max_possible;
  if (max >= 0 && min_items > max) return g_.nothing();
  // States count the items written; the last one loops when unbounded.
  const int64_t last = max >= 0 ? max : std::max<int64_t>({k, min_items, 1});
  MEGACTX_CHECK(last <= kMaxCountedItems,
                "array bounds need {} counted items; at most {} are supported", last,
                kMaxCountedItems);
  const ExprId separator = item_separator();
  std::vector<GraphEdge> edges;
  std::vector<int32_t> finals;
  auto item = [&](int64_t i) { return i < k ? prefix[i] : rest; };
  for (int64_t i = 0; i < last; ++i) {
    const ExprId x = item(i);
    edges.push_back({static_cast<int32_t>(i), static_cast<int32_t>(i + 1),
                     i == 0 ? x : g_.seq({separator, x})});
  }
  if (max < 0) {
    edges.push_back(
        {static_cast<int32_t>(last), static_cast<int32_t>(last), g_.seq({separator, rest})});
  }
  // State i has written i items: finals of one item or more, the empty
  // array apart.
  for (int64_t i = std::max<int64_t>(min_items, 1); i <= last; ++i)
    finals.push_back(static_cast<int32_t>(i));
  if (finals.empty()) return g_.seq({g_.byte('['), ws(), g_.byte(']')});
  const ExprId body =
      g_.graph(static_cast<int32_t>(last + 1), 0, std::move(finals), std::move(edges));
  return bracketed('[', body, min_items == 0, ']');
}

}  // namespace megactx::grammar
