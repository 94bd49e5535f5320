// OpenAI-style API errors: {"error": {"message", "type", "param", "code"}}
// with the HTTP status that goes with them. Handlers throw ApiError; the
// router turns it (and any other exception) into a response, never a crash.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"
#include "server/http_types.h"

namespace megactx::server {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {});
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

// 400 naming the offending parameter.
[[noreturn]] void throw_invalid(const std::string& param, const std::string& message);

// OpenAI's error "type" for a status: invalid_request_error, authentication_error, ...
std::string error_type_for_status(int status);

nlohmann::json error_json(int status, const std::string& message, const std::string& param = {});
HttpResponse error_response(int status, const std::string& message, const std::string& param = {});

}  // namespace megactx::server
