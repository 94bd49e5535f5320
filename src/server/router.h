// Routing: (method, path) -> handler, with the API key check and the
// translation of exceptions into error responses. 404 for an unknown path,
// 405 (with Allow) for a known path and the wrong method.
#pragma once

#include <map>
#include <set>
#include <string>

#include "server/http_types.h"

namespace megactx::server {

class Router {
 public:
  void add(const std::string& method, const std::string& path, RequestHandler handler,
           bool requires_auth = true);
  // Bearer token required on routes that ask for it; empty = no auth.
  void set_api_key(std::string api_key) { api_key_ = std::move(api_key); }
  // Dispatches; a handler that throws gets an error response on its channel.
  void handle(const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) const;

 private:
  struct Route {
    RequestHandler handler;
    bool requires_auth = true;
  };
  bool authorized(const HttpRequest& request) const;

  std::map<std::string, std::map<std::string, Route>> routes_;  // path -> method -> route
  std::string api_key_;
};

// Runs `body`; an exception becomes an error response on `channel`
// (ApiError keeps its status, megactx::Error is a 400, anything else a 500).
void respond_on_error(ResponseChannel& channel, const std::function<void()>& body);

}  // namespace megactx::server
