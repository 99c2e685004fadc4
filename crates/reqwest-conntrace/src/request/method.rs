//! The HTTP request method as the HTTP semantic conventions (v1.42.0) know
//! it: the known set, which names the span, and `_OTHER` for the rest.

/// The well-known values of `http.request.method` (HTTP semconv v1.42.0).
const KNOWN_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY",
];

/// Whether `method` is in the known set (exact, case-sensitive).
pub(crate) fn is_known_method(method: &str) -> bool {
    KNOWN_METHODS.contains(&method)
}

/// The `http.request.method` value: the method, or `_OTHER` outside the
/// known set (HTTP semconv).
pub(crate) fn method_attribute(method: &http::Method) -> &'static str {
    KNOWN_METHODS
        .iter()
        .find(|m| **m == method.as_str())
        .copied()
        .unwrap_or("_OTHER")
}
