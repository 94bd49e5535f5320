// The browser playground and dashboard at "/": the embedded files of
// web_assets.h served with their content types, gzip when the client takes
// it, cache headers (hashed assets immutable, the page revalidated by ETag),
// and the JSON endpoints the page reads (web_api.cpp). The files need no API
// key (the page must load to ask for one); the endpoints that touch the model
// do.
#pragma once

#include "server/http_types.h"
#include "server/router.h"
#include "server/server_state.h"
#include "server/web_assets.h"

namespace megactx::server {

// Registers every embedded file at its exact path ("/" serves index.html),
// or a page saying the UI was not built, plus the web API routes.
void add_web_ui_routes(Router& router, ServerState& state);
// The JSON endpoints of the UI: GET /ui/stats, GET /ui/model, POST /tokenize,
// POST /detokenize (web_api.cpp).
void add_web_api_routes(Router& router, ServerState& state);

// The response for one file: 304 when If-None-Match names its ETag, the gzip
// body when Accept-Encoding allows it.
HttpResponse web_asset_response(const WebAsset& asset, const HttpRequest& request);
// True when an Accept-Encoding value accepts gzip (q > 0, or via "*").
bool accepts_gzip(const std::string& accept_encoding);

}  // namespace megactx::server
