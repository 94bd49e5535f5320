// JSON numbers within bounds (JSON Schema minimum / maximum /
// exclusiveMinimum / exclusiveMaximum, and enum/const numbers as [c, c]) as
// an exact regular language over decimal text: comparing a decimal string to
// a constant is digit-by-digit, so `x >= c` is a regex; two bounds are the
// product of two automata. Bounded numbers are written without an exponent.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "grammar/fsm.h"
#include "grammar/grammar_ir.h"

namespace megactx::grammar {

// An exact decimal: negative, integer digits (no leading zeros, "0" for
// zero) and fraction digits (no trailing zeros).
struct Decimal {
  bool negative = false;
  std::string integer = "0";
  std::string fraction;
  bool is_zero() const { return integer == "0" && fraction.empty(); }
};

// Parses JSON number text (e.g. "-1.5e3"); throws megactx::Error when it is
// not one or its exponent is absurd.
Decimal parse_decimal(std::string_view text);

struct NumberBound {
  Decimal value;
  bool exclusive = false;
};

// The numbers in [lower, upper] (each side optional), integers only when
// `integer`. Nothing when the interval is empty.
ExprId bounded_number(Grammar& grammar, const std::optional<NumberBound>& lower,
                      const std::optional<NumberBound>& upper, bool integer,
                      const FsmLimits& limits);

}  // namespace megactx::grammar
