# cmake -DMEGACTX=... -DMODEL_DIR=... -DIDS_FILE=... -DFIXTURE=... -P passkey_test.cmake
# Greedy-decodes 16 tokens after the passkey prompt and requires the pass key in the text.
foreach(var MEGACTX MODEL_DIR IDS_FILE FIXTURE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "passkey_test.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(COMMAND ${MEGACTX} --help OUTPUT_VARIABLE help ERROR_VARIABLE help_err)
if(NOT help MATCHES "generate" AND NOT help_err MATCHES "generate")
  message("SKIPPED: ${MEGACTX} has no generate command yet")
  return()
endif()

file(READ ${FIXTURE} fixture)
string(JSON key GET "${fixture}" key)
file(READ ${IDS_FILE} ids)
string(STRIP "${ids}" ids)

execute_process(
  COMMAND ${MEGACTX} generate --model ${MODEL_DIR} --device cpu --input-ids ${ids}
          --max-new-tokens 16 --temperature 0 --format text
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "megactx generate failed (exit ${rc}):\n${err}")
endif()
message("generated: ${out}")
string(FIND "${out}" "${key}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the pass key ${key} is not in the generated text: '${out}'")
endif()
message("pass key ${key} found")
