// The web UI's files (web/ built by Vite), compiled into the binary by the
// build (web/web_ui.cmake generates the table from web/dist), so `megactx
// serve` needs neither the network nor files beside it at run time. When the
// UI could not be built (no node/npm, or the npm step failed) the table is
// empty and web_ui_build_note() says why.
#pragma once

#include <span>
#include <string_view>

namespace megactx::server {

struct WebAsset {
  std::string_view path;          // URL path: "/index.html", "/assets/index-1a2b3c.js"
  std::string_view content_type;  // with charset for text types
  std::string_view body;
  std::string_view gzip_body;  // empty when gzip does not make it smaller
  std::string_view etag;       // quoted, from the content hash
  bool immutable = false;      // a content-hashed name: cacheable forever
};

std::span<const WebAsset> web_assets();
// Empty when the UI was built; otherwise the reason it was not.
std::string_view web_ui_build_note();

}  // namespace megactx::server
