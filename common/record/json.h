// JSON parsing for the record format's own documents (manifest, shard header,
// schema).
#ifndef SLUICE_COMMON_RECORD_JSON_H_
#define SLUICE_COMMON_RECORD_JSON_H_

#include <string_view>

#include "nlohmann/json.hpp"

namespace sluice::record {

// Our documents nest 5 levels; anything much deeper is corrupt or hostile
// (recursion in later processing would exhaust the stack).
inline constexpr int kMaxJsonDepth = 32;

// Parses `text` without exceptions. Returns a discarded value (is_discarded())
// for invalid JSON or JSON nested deeper than kMaxJsonDepth.
inline nlohmann::json ParseJson(std::string_view text) {
  bool too_deep = false;
  nlohmann::json::parser_callback_t limit_depth =
      [&too_deep](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxJsonDepth) too_deep = true;
        return !too_deep;
      };
  nlohmann::json parsed = nlohmann::json::parse(text, limit_depth, /*allow_exceptions=*/false);
  if (too_deep) return nlohmann::json(nlohmann::json::value_t::discarded);
  return parsed;
}

}  // namespace sluice::record

#endif  // SLUICE_COMMON_RECORD_JSON_H_
