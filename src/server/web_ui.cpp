#include "server/web_ui.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>

namespace megactx::server {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// The page may load only what the server itself serves: no CDN, no inline
// script. uPlot sizes its canvas through style attributes, hence
// 'unsafe-inline' for styles only.
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

bool is_html(std::string_view content_type) {
  return content_type.substr(0, 9) == "text/html";
}

void add_security_headers(HttpResponse& response, std::string_view content_type) {
  response.headers["X-Content-Type-Options"] = "nosniff";
  if (is_html(content_type)) {
    response.headers["Content-Security-Policy"] = kContentSecurityPolicy;
    response.headers["Referrer-Policy"] = "no-referrer";
    response.headers["X-Frame-Options"] = "DENY";
  }
}

// If-None-Match: "*" or a list of (possibly weak) entity tags.
bool etag_matches(const std::string& if_none_match, std::string_view etag) {
  if (if_none_match.empty() || etag.empty()) return false;
  std::string_view rest = if_none_match;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item == "*") return true;
    if (item.substr(0, 2) == "W/") item.remove_prefix(2);  // weak comparison, as for GET
    if (item == etag) return true;
  }
  return false;
}

// Shown at "/" when the build could not make the UI: says why and how to fix
// it instead of a bare 404.
HttpResponse not_built_page() {
  std::string note(web_ui_build_note());
  std::string escaped;
  for (char c : note) {
    if (c == '<')
      escaped += "&lt;";
    else if (c == '>')
      escaped += "&gt;";
    else if (c == '&')
      escaped += "&amp;";
    else
      escaped += c;
  }
  HttpResponse response;
  response.content_type = "text/html; charset=utf-8";
  response.body =
      "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
      "<title>megactx: web UI not built</title></head><body style=\"font-family:sans-serif;"
      "max-width:40em;margin:2em auto;padding:0 1em\"><h1>The megactx web UI was not built</h1>"
      "<p>This binary was built without the playground and dashboard: " +
      escaped +
      "</p><p>Install Node.js and npm (<code>bash scripts/install-deps.sh</code>), then "
      "re-run CMake and rebuild (<code>cmake -S . -B build &amp;&amp; cmake --build build "
      "--target megactx</code>). The API works as usual: <code>/v1/chat/completions</code>, "
      "<code>/generate</code>, <code>/metrics</code>.</p></body></html>";
  response.headers["Cache-Control"] = "no-cache";
  add_security_headers(response, response.content_type);
  return response;
}

}  // namespace

bool accepts_gzip(const std::string& accept_encoding) {
  std::string_view rest = accept_encoding;
  std::optional<bool> gzip, star;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    size_t semicolon = item.find(';');
    std::string coding = lower(trim(item.substr(0, semicolon)));
    bool allowed = true;
    if (semicolon != std::string_view::npos) {
      std::string parameter = lower(trim(item.substr(semicolon + 1)));
      if (parameter.substr(0, 2) == "q=") {
        // q=0, q=0.0, q=0.000 refuse; any other weight accepts.
        std::string_view weight = std::string_view(parameter).substr(2);
        allowed = weight.find_first_not_of("0.") != std::string_view::npos;
      }
    }
    if (coding == "gzip" || coding == "x-gzip")
      gzip = allowed;
    else if (coding == "*")
      star = allowed;
  }
  if (gzip) return *gzip;
  return star.value_or(false);
}

HttpResponse web_asset_response(const WebAsset& asset, const HttpRequest& request) {
  HttpResponse response;
  // Hashed file names never change content; the page itself (and unhashed
  // files) is revalidated each time so a rebuilt server is seen at once.
  response.headers["Cache-Control"] =
      asset.immutable ? "public, max-age=31536000, immutable" : "no-cache";
  response.headers["ETag"] = std::string(asset.etag);
  if (!asset.gzip_body.empty()) response.headers["Vary"] = "Accept-Encoding";
  add_security_headers(response, asset.content_type);
  if (etag_matches(request.header("if-none-match"), asset.etag)) {
    response.status = 304;
    response.content_type.clear();
    return response;
  }
  response.content_type = std::string(asset.content_type);
  if (!asset.gzip_body.empty() && accepts_gzip(request.header("accept-encoding"))) {
    response.headers["Content-Encoding"] = "gzip";
    response.body = std::string(asset.gzip_body);
  } else {
    response.body = std::string(asset.body);
  }
  return response;
}

void add_web_ui_routes(Router& router, ServerState& state) {
  bool have_index = false;
  for (const WebAsset& asset : web_assets()) {
    const WebAsset* file = &asset;
    auto handler = [file](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
      channel->respond(web_asset_response(*file, request));
    };
    router.add("GET", std::string(asset.path), handler, /*requires_auth=*/false);
    if (asset.path == "/index.html") {
      router.add("GET", "/", handler, /*requires_auth=*/false);
      have_index = true;
    }
  }
  if (!have_index)
    router.add(
        "GET", "/",
        [](const HttpRequest&, std::shared_ptr<ResponseChannel> channel) {
          channel->respond(not_built_page());
        },
        /*requires_auth=*/false);
  add_web_api_routes(router, state);
}

}  // namespace megactx::server
