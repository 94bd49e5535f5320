// Fingerprints of a conversation for history matching: one 64-bit hash per
// message of what the model's context depends on (role, content text, the
// calls' names and arguments), blind to what clients rewrite freely (tool
// call ids, whitespace at the ends of a content, reasoning_content, which
// agents often drop, argument JSON spacing and key order), and one leading
// "header" hash of what frames every message (the tools offered, the chat
// template's kwargs): a changed tool list makes a different history.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace megactx::gateway {

uint64_t message_fingerprint(const nlohmann::json& message);

// The header hash of a chat request body (tools, chat_template_kwargs).
uint64_t header_fingerprint(const nlohmann::json& body);

// [header, messages[0], messages[1], ...] of a chat request body.
std::vector<uint64_t> history_fingerprints(const nlohmann::json& body);

}  // namespace megactx::gateway
