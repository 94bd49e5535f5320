#include "grammar/text_languages.h"

#include "core/error.h"

namespace megactx::grammar {

ExprId any_char(Grammar& grammar) {
  return grammar.code_points({{0, 0x10FFFF}});
}

ExprId any_text(Grammar& grammar) {
  return grammar.star(any_char(grammar));
}

ExprId text_without(Grammar& grammar, std::string_view marker, const FsmLimits& limits) {
  return text_without_any(grammar, {marker}, limits);
}

ExprId text_without_any(Grammar& grammar, const std::vector<std::string_view>& markers,
                        const FsmLimits& limits) {
  // Any text minus the texts containing a marker: a product of two small
  // automata (the second has about one state per marker byte).
  std::vector<ExprId> literals;
  for (std::string_view marker : markers) {
    MEGACTX_CHECK(!marker.empty(), "text_without: an empty marker");
    literals.push_back(grammar.literal(marker));
  }
  const ExprId containing =
      grammar.seq({any_text(grammar), grammar.alt(std::move(literals)), any_text(grammar)});
  return subtract_text(grammar, any_text(grammar), containing, "text without a marker", limits);
}

ExprId intersect_all(Grammar& grammar, const std::vector<ExprId>& parts, std::string_view what,
                     const FsmLimits& limits) {
  MEGACTX_CHECK(!parts.empty(), "intersect_all: no parts");
  if (parts.size() == 1) return parts[0];
  Dfa dfa = build_dfa(grammar, parts[0], limits, what);
  for (size_t i = 1; i < parts.size(); ++i)
    dfa = intersect(dfa, build_dfa(grammar, parts[i], limits, what));
  minimize(dfa);
  return dfa_to_expr(grammar, dfa);
}

ExprId subtract_text(Grammar& grammar, ExprId a, ExprId b, std::string_view what,
                     const FsmLimits& limits) {
  Dfa dfa = subtract(build_dfa(grammar, a, limits, what), build_dfa(grammar, b, limits, what));
  minimize(dfa);
  return dfa_to_expr(grammar, dfa);
}

ExprId marker(Grammar& grammar, const Vocabulary& vocabulary, std::string_view text) {
  const std::optional<int32_t> id = vocabulary.find_token(text);
  if (id && vocabulary.is_special(*id)) return grammar.token({*id});
  return grammar.literal(text);
}

}  // namespace megactx::grammar
