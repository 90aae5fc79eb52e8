//! The operator web UI: static files embedded in the binary (no network at runtime, no build
//! step), served at `/` and `/ui/*` beside the API. The page talks to `/api` and `/metrics` like
//! any other client. Scripts are ES modules: `app.js` (pages, routing), `dom.js` (DOM and time
//! helpers), `timeline.js` (a run as a timeline), `server.js` (the server's charts), `access.js` and `batches.js` (those pages).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");
const DOM_JS: &str = include_str!("../ui/dom.js");
const TIMELINE_JS: &str = include_str!("../ui/timeline.js");
const SERVER_JS: &str = include_str!("../ui/server.js");
const ACCESS_JS: &str = include_str!("../ui/access.js");
const BATCHES_JS: &str = include_str!("../ui/batches.js");
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// Only our own script, styles and API: a workflow id or payload rendered into the page cannot
/// load or run anything else.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's paths (the request metrics declare a series for each).
pub const PATHS: [&str; 8] = [
    "/",
    "/ui/app.js",
    "/ui/app.css",
    "/ui/dom.js",
    "/ui/timeline.js",
    "/ui/server.js",
    "/ui/access.js",
    "/ui/batches.js",
];

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }))
        .route("/ui/app.js", get(|| async { asset(APP_JS, JAVASCRIPT) }))
        .route("/ui/dom.js", get(|| async { asset(DOM_JS, JAVASCRIPT) }))
        .route("/ui/timeline.js", get(|| async { asset(TIMELINE_JS, JAVASCRIPT) }))
        .route("/ui/server.js", get(|| async { asset(SERVER_JS, JAVASCRIPT) }))
        .route("/ui/access.js", get(|| async { asset(ACCESS_JS, JAVASCRIPT) }))
        .route("/ui/batches.js", get(|| async { asset(BATCHES_JS, JAVASCRIPT) }))
        .route("/ui/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change with the binary; revalidate rather than serve a stale page after an upgrade.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}
