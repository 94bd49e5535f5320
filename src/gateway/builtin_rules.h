// The built-in rule sets of the guard, one per class of the public reward-
// hacking taxonomy (test_tampering, vcs_leakage, network_fetch,
// protected_paths, evaluator_patching): builtin_rules.json, compiled into
// the binary by embed_rules.cmake. The JSON maps each set's name to its
// rules in the rules-file format (rule_filter.h).
#pragma once

namespace megactx::gateway {

const char* builtin_rules_json();

}  // namespace megactx::gateway
