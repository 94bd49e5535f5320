# Writes OUTPUT, a C++ source that returns the text of INPUT (the built-in
# guard rules) from megactx::gateway::builtin_rules_json().
file(READ ${INPUT} content)
file(WRITE ${OUTPUT}
     "// Generated from builtin_rules.json by embed_rules.cmake; do not edit.\n"
     "#include \"gateway/builtin_rules.h\"\n\n"
     "namespace megactx::gateway {\n\n"
     "const char* builtin_rules_json() {\n"
     "  return R\"megactx_rules(${content})megactx_rules\";\n"
     "}\n\n"
     "}  // namespace megactx::gateway\n")
