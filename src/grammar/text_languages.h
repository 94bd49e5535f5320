// Languages of plain text for grammars that wrap other grammars (a chat
// model's reasoning before a JSON answer, the raw string values of tool-call
// markup): any UTF-8 text, text that never contains a marker, the
// intersection of several call-free languages, and a marker that is one
// special token where the vocabulary has it.
#pragma once

#include <string_view>
#include <vector>

#include "grammar/fsm.h"
#include "grammar/grammar_ir.h"
#include "grammar/vocabulary.h"

namespace megactx::grammar {

// One UTF-8 character (any scalar value).
ExprId any_char(Grammar& grammar);
// Any UTF-8 text, "" included.
ExprId any_text(Grammar& grammar);
// Any UTF-8 text in which `marker` never occurs (so a parser that looks for
// the marker cannot end the text early), "" included.
ExprId text_without(Grammar& grammar, std::string_view marker, const FsmLimits& limits = {});
// Any UTF-8 text in which none of `markers` occurs.
ExprId text_without_any(Grammar& grammar, const std::vector<std::string_view>& markers,
                        const FsmLimits& limits = {});
// The strings every expression of `parts` matches (call-free expressions);
// `what` names them in errors.
ExprId intersect_all(Grammar& grammar, const std::vector<ExprId>& parts, std::string_view what,
                     const FsmLimits& limits = {});
// The strings of `a` that `b` does not match (call-free expressions).
ExprId subtract_text(Grammar& grammar, ExprId a, ExprId b, std::string_view what,
                     const FsmLimits& limits = {});
// `text` as the special token whose bytes are exactly `text` when the
// vocabulary has one (never matched by bytes, so a model writes it as that
// token), else as its bytes.
ExprId marker(Grammar& grammar, const Vocabulary& vocabulary, std::string_view text);

}  // namespace megactx::grammar
