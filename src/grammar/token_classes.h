// Splits the vocabulary for one node of a compiled grammar into accepted,
// rejected and context-dependent tokens, walking the vocabulary's byte trie
// once: a prefix that no path survives prunes its whole subtree.
//
// The stack below the node's rule is unknown here. A path that ends the rule
// continues, approximately, at every place that calls the rule (a few levels
// up); a token that survives only through such a continuation is
// context-dependent and the matcher checks it against the real stack, a token
// that dies everywhere is rejected (the real stack is one of those places).
#pragma once

#include <cstdint>

#include "grammar/compiled_grammar.h"

namespace megactx::grammar {

TokenClasses classify_tokens(const CompiledGrammar& grammar, int32_t node);

}  // namespace megactx::grammar
