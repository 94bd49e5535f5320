# Run by CTest (see CMakeLists.txt): compares `megactx render-chat` with the
# reference renderer (tools/fixtures/render_chat_template.py under Debian's
# /usr/bin/python3) byte for byte, for both model templates.
set(REFERENCE ${SOURCE_DIR}/tools/fixtures/render_chat_template.py)
file(MAKE_DIRECTORY ${WORK_DIR})

foreach(template GLM-4.6 DeepSeek-V3.2)
  foreach(request tool_calls unicode_and_escapes thinking_off)
    set(template_file ${SOURCE_DIR}/tests/fixtures/chat/model_templates/${template}.jinja)
    set(request_file ${SOURCE_DIR}/tests/fixtures/chat/requests/${request}.json)
    execute_process(COMMAND ${MEGACTX} render-chat --template ${template_file} --request ${request_file}
                    OUTPUT_FILE ${WORK_DIR}/${template}_${request}.megactx RESULT_VARIABLE ours)
    execute_process(COMMAND /usr/bin/python3 ${REFERENCE} ${template_file} ${request_file}
                    OUTPUT_FILE ${WORK_DIR}/${template}_${request}.reference RESULT_VARIABLE theirs)
    if(NOT ours EQUAL 0 OR NOT theirs EQUAL 0)
      message(FATAL_ERROR "${template} x ${request}: megactx exit ${ours}, reference exit ${theirs}")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/${template}_${request}.megactx
                            ${WORK_DIR}/${template}_${request}.reference RESULT_VARIABLE different)
    if(different)
      message(FATAL_ERROR "${template} x ${request}: render-chat output differs from the reference")
    endif()
  endforeach()
endforeach()

file(WRITE ${WORK_DIR}/broken.jinja "ok\n{% for x in y %}")
execute_process(COMMAND ${MEGACTX} render-chat --template ${WORK_DIR}/broken.jinja
                        --request ${SOURCE_DIR}/tests/fixtures/chat/requests/system_user.json
                RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 1 OR NOT out STREQUAL "" OR NOT err MATCHES "^error: line 2, column 17: unexpected end of template")
  message(FATAL_ERROR "broken template: exit ${status}, stdout '${out}', stderr '${err}'")
endif()
message(STATUS "render-chat matches the reference")
