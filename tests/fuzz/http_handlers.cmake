megactx_add_fuzzer(http_handlers LIBS megactx_gateway megactx_server megactx_engine megactx_chat megactx_tokenizer megactx_io
                   megactx_core DICT http_handlers.dict)
