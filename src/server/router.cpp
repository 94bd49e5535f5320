#include "server/router.h"

#include <spdlog/spdlog.h>

#include "server/api_error.h"

namespace megactx::server {

void Router::add(const std::string& method, const std::string& path, RequestHandler handler,
                 bool requires_auth) {
  routes_[path][method] = Route{std::move(handler), requires_auth};
}

bool Router::authorized(const HttpRequest& request) const {
  if (api_key_.empty()) return true;
  std::string header = request.header("authorization");
  const std::string prefix = "Bearer ";
  if (header.size() <= prefix.size()) return false;
  // Case-insensitive scheme, exact token.
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i])))
      return false;
  std::string token = header.substr(prefix.size());
  // Constant-time comparison so the key cannot be guessed byte by byte.
  if (token.size() != api_key_.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < token.size(); ++i)
    difference |= static_cast<unsigned char>(token[i] ^ api_key_[i]);
  return difference == 0;
}

void respond_on_error(ResponseChannel& channel, const std::function<void()>& body) {
  try {
    body();
  } catch (const ApiError& error) {
    channel.respond(error_response(error.status(), error.what(), error.param()));
  } catch (const Error& error) {
    channel.respond(error_response(400, error.what()));
  } catch (const std::exception& error) {
    spdlog::error("internal error while handling a request: {}", error.what());
    channel.respond(error_response(500, std::string("internal error: ") + error.what()));
  }
}

void Router::handle(const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) const {
  auto path_it = routes_.find(request.path);
  if (path_it == routes_.end()) {
    channel->respond(error_response(404, "no route for " + request.method + " " + request.path));
    return;
  }
  std::string method = request.method == "HEAD" ? "GET" : request.method;
  auto method_it = path_it->second.find(method);
  if (method_it == path_it->second.end()) {
    std::string allow;
    for (const auto& [name, route] : path_it->second) allow += (allow.empty() ? "" : ", ") + name;
    HttpResponse response =
        error_response(405, "method " + request.method + " not allowed on " + request.path);
    response.headers["Allow"] = allow;
    channel->respond(std::move(response));
    return;
  }
  const Route& route = method_it->second;
  if (route.requires_auth && !authorized(request)) {
    channel->respond(error_response(401, "missing or invalid API key (Authorization: Bearer ...)"));
    return;
  }
  respond_on_error(*channel, [&] { route.handler(request, channel); });
}

}  // namespace megactx::server
