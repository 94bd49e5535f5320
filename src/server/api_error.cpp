#include "server/api_error.h"

#include "server/json_text.h"

namespace megactx::server {

ApiError::ApiError(int status, std::string message, std::string param)
    : Error(std::move(message)), status_(status), param_(std::move(param)) {}

void throw_invalid(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

std::string error_type_for_status(int status) {
  switch (status) {
    case 400:
    case 404:
    case 405:
    case 413:
    case 431:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 501:  // a route megactx knows but does not serve (e.g. NCCL weight updates)
      return "not_implemented_error";
    case 503:
      return "server_overloaded";
    default:
      return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

nlohmann::json error_json(int status, const std::string& message, const std::string& param) {
  nlohmann::json error = {
      {"message", message},
      {"type", error_type_for_status(status)},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
      {"code", status}};
  return {{"error", std::move(error)}};
}

HttpResponse error_response(int status, const std::string& message, const std::string& param) {
  HttpResponse response;
  response.status = status;
  response.body = dump_json(error_json(status, message, param));
  if (status == 401) response.headers["WWW-Authenticate"] = "Bearer";
  return response;
}

}  // namespace megactx::server
