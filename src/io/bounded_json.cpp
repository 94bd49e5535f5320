#include "io/bounded_json.h"

#include "core/error.h"

namespace megactx {

namespace {

struct TooDeep {};

// The callback parser reports each container's start with the number of
// containers enclosing it, before it descends: stopping there bounds every
// later recursion over the value.
template <class Json>
typename Json::parser_callback_t depth_guard(int max_depth) {
  return [max_depth](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= max_depth)
      throw TooDeep{};
    return true;
  };
}

template <class Json>
Json parse_bounded(std::string_view text, int max_depth) {
  try {
    return Json::parse(text, depth_guard<Json>(max_depth));
  } catch (const TooDeep&) {
    fail("JSON nested deeper than {} levels", max_depth);
  }
}

template <class Json>
Json try_parse_bounded(std::string_view text, int max_depth) {
  try {
    return Json::parse(text, depth_guard<Json>(max_depth), /*allow_exceptions=*/false);
  } catch (const TooDeep&) {
    return Json(Json::value_t::discarded);
  }
}

}  // namespace

nlohmann::json parse_json(std::string_view text, int max_depth) {
  return parse_bounded<nlohmann::json>(text, max_depth);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, max_depth);
}

nlohmann::json try_parse_json(std::string_view text, int max_depth) {
  return try_parse_bounded<nlohmann::json>(text, max_depth);
}

nlohmann::ordered_json try_parse_ordered_json(std::string_view text, int max_depth) {
  return try_parse_bounded<nlohmann::ordered_json>(text, max_depth);
}

}  // namespace megactx
