// Requests sent straight to a Router (no sockets), for the server's and the
// gateway's fixtures: start() returns the channel at once, call() once the
// handler has completed the response.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "fake_channel.h"
#include "server/router.h"

namespace megactx::server::testing {

inline std::shared_ptr<RecordingChannel> start_request(Router& router, const std::string& method,
                                                       const std::string& path,
                                                       const std::string& body,
                                                       std::map<std::string, std::string> headers) {
  HttpRequest request;
  request.method = method;
  request.target = path;
  request.path = path.substr(0, path.find('?'));
  request.body = body;
  request.headers = std::move(headers);
  auto channel = std::make_shared<RecordingChannel>();
  router.handle(request, channel);
  return channel;
}

// A JSON body (none when null); the response must complete and use the
// channel correctly.
inline std::shared_ptr<RecordingChannel> call_request(Router& router, const std::string& method,
                                                      const std::string& path,
                                                      const nlohmann::json& body,
                                                      std::map<std::string, std::string> headers) {
  auto channel = start_request(router, method, path, body.is_null() ? std::string() : body.dump(),
                               std::move(headers));
  EXPECT_TRUE(channel->wait()) << method << " " << path << " did not complete";
  EXPECT_EQ(channel->misuse, 0);
  return channel;
}

}  // namespace megactx::server::testing
