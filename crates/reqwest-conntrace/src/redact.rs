//! The one redaction every string the library exports or hands out passes
//! through: `url.full`, [`RequestReport::url`](crate::RequestReport::url),
//! span status messages and `exception.message` of failed requests,
//! connection set-ups and lookups, and [`BuildError`](crate::BuildError)
//! texts.
//!
//! # Choice against the conventions
//! The URL semantic conventions (v1.42.0, `url.full`) require user name and
//! password to be replaced by `REDACTED`, and the values of four query keys
//! (`AWSAccessKeyId`, `Signature`, `sig`, `X-Goog-Signature`) by default.
//! That list misses the signed-URL parameters clouds use today and the
//! OAuth token parameters, so [`DEFAULT_REDACTED_QUERY_KEYS`] extends it
//! (each key with its source). Keys match ASCII-case-insensitively after
//! percent-decoding: signed-URL tools emit both spellings
//! (`X-Goog-Signature` from the V4 signing docs, `x-goog-signature` from
//! `gsutil signurl`; `X-Amz-Security-Token` and `x-amz-security-token`), and
//! a key that a server reads in any case must be redacted in any case.
//! [`UrlRedaction::redact_all_query_values`] replaces every query value
//! instead, the default of OpenTelemetry .NET's HttpClient instrumentation.
//!
//! Error texts are never copied from reqwest as they are: reqwest's
//! `Display` prints the full URL, so the text of a `reqwest::Error` is
//! rebuilt from its kind and its redacted URL, and any URL inside another
//! error's text is redacted the same way.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use url::Url;

/// Query keys whose values are redacted by default, matched
/// ASCII-case-insensitively after percent-decoding:
///
/// | key | source |
/// |---|---|
/// | `AWSAccessKeyId`, `Signature` | semconv `url.full` (v1.42.0); AWS Signature Version 2 query authentication |
/// | `sig` | semconv `url.full`; Azure Storage shared access signature (SAS) |
/// | `X-Goog-Signature` | semconv `url.full`; Google Cloud Storage V4 signed URLs |
/// | `X-Goog-Credential` | Google Cloud Storage V4 signed URLs (service account and key scope) |
/// | `GoogleAccessId` | Google Cloud Storage V2 signed URLs |
/// | `X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token` | AWS Signature Version 4 query-string authentication (presigned URLs; the token of temporary STS credentials) |
/// | `access_token` | OAuth 2.0 bearer tokens in the URI query, RFC 6750 §2.3 |
/// | `refresh_token`, `client_secret` | OAuth 2.0, RFC 6749 §6 and §2.3.1 |
/// | `id_token` | OpenID Connect Core 1.0 §3.2.2.5 |
/// | `code` is **not** listed | the OAuth authorization code (RFC 6749 §4.1.2) is single-use and the key is common in other meanings; add it with [`UrlRedaction::add_query_key`] |
/// | `api_key`, `apikey`, `key` | API keys passed in the query (Google Cloud API keys use `key`) |
/// | `token`, `auth`, `password` | generic token and password parameters |
pub const DEFAULT_REDACTED_QUERY_KEYS: &[&str] = &[
    "AWSAccessKeyId",
    "Signature",
    "sig",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "GoogleAccessId",
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "access_token",
    "refresh_token",
    "client_secret",
    "id_token",
    "api_key",
    "apikey",
    "key",
    "token",
    "auth",
    "password",
];

/// The replacement the conventions prescribe.
const REDACTED: &str = "REDACTED";

/// How URLs (and the URLs inside error texts) are redacted before they are
/// exported or handed out. Set it with
/// [`ConnTraceBuilder::url_redaction`](crate::ConnTraceBuilder::url_redaction).
///
/// Always: user name and password become `REDACTED`, the fragment is
/// dropped (it is never sent). Query values of [`DEFAULT_REDACTED_QUERY_KEYS`]
/// and of the keys added with [`add_query_key`](Self::add_query_key) become
/// `REDACTED`, or every query value with
/// [`redact_all_query_values`](Self::redact_all_query_values). Keys are kept
/// as sent.
#[derive(Debug, Clone)]
pub struct UrlRedaction {
    extra_keys: Arc<[String]>,
    all_query_values: bool,
}

impl Default for UrlRedaction {
    fn default() -> Self {
        Self {
            extra_keys: Arc::from(Vec::new()),
            all_query_values: false,
        }
    }
}

impl UrlRedaction {
    /// The default redaction (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// The default redaction, shared.
    pub(crate) fn standard() -> &'static Self {
        static STANDARD: OnceLock<UrlRedaction> = OnceLock::new();
        STANDARD.get_or_init(Self::default)
    }

    /// Redacts the values of the query key `key` too (matched
    /// ASCII-case-insensitively after percent-decoding). Default: only
    /// [`DEFAULT_REDACTED_QUERY_KEYS`].
    pub fn add_query_key(mut self, key: impl Into<String>) -> Self {
        let mut keys: Vec<String> = self.extra_keys.to_vec();
        keys.push(key.into());
        self.extra_keys = Arc::from(keys);
        self
    }

    /// Replaces every query value by `REDACTED`, as OpenTelemetry .NET's
    /// HttpClient instrumentation does by default. Default: `false` (only
    /// the listed keys).
    pub fn redact_all_query_values(mut self, on: bool) -> Self {
        self.all_query_values = on;
        self
    }

    fn is_secret_key(&self, raw: &str) -> bool {
        if self.all_query_values {
            return true;
        }
        let decoded: Cow<'_, str> = if raw.contains(['%', '+']) {
            match url::form_urlencoded::parse(raw.as_bytes()).next() {
                Some((k, _)) => Cow::Owned(k.into_owned()),
                None => Cow::Borrowed(raw),
            }
        } else {
            Cow::Borrowed(raw)
        };
        DEFAULT_REDACTED_QUERY_KEYS
            .iter()
            .copied()
            .chain(self.extra_keys.iter().map(String::as_str))
            .any(|k| k.eq_ignore_ascii_case(&decoded))
    }

    /// Whether `url` has a query value to redact.
    fn needs_query(&self, url: &Url) -> bool {
        url.query().is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.contains('=') && self.is_secret_key(key_of(pair)))
        })
    }

    /// Whether `url` is exported as it is: nothing to redact, no fragment.
    fn is_clean(&self, url: &Url) -> bool {
        url.username().is_empty()
            && url.password().is_none()
            && url.fragment().is_none()
            && !self.needs_query(url)
    }

    /// As [`redact`](Self::redact), as a shared string (one allocation
    /// where `redact(..).into()` made two and copied the URL twice).
    pub(crate) fn redact_shared(&self, url: &Url) -> Arc<str> {
        if self.is_clean(url) {
            Arc::from(url.as_str())
        } else {
            Arc::from(self.redact(url))
        }
    }

    /// `url` as it may be exported (`url.full`): see the type's docs.
    pub fn redact(&self, url: &Url) -> String {
        if self.is_clean(url) {
            return url.as_str().to_owned();
        }
        let needs_query = self.needs_query(url);
        let mut out = url.clone();
        out.set_fragment(None);
        if !out.username().is_empty() {
            // Errors only for cannot-be-a-base URLs, which carry no credentials.
            let _ = out.set_username(REDACTED);
        }
        if out.password().is_some() {
            let _ = out.set_password(Some(REDACTED));
        }
        if needs_query && let Some(query) = url.query() {
            out.set_query(Some(&self.redact_query(query)));
        }
        out.to_string()
    }

    /// `query` (without `?`) with the values of the secret keys replaced.
    fn redact_query(&self, query: &str) -> String {
        let mut redacted = String::with_capacity(query.len());
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                redacted.push('&');
            }
            match pair.split_once('=') {
                Some((k, _)) if self.is_secret_key(k) => {
                    let _ = write!(redacted, "{k}={REDACTED}");
                }
                _ => redacted.push_str(pair),
            }
        }
        redacted
    }

    /// A string that may not be a valid URL (a proxy URL in an error
    /// message, a mistyped URL echoed in a usage error): redacted as a URL
    /// when it parses; otherwise anything between `://` and the last `@`
    /// of the authority is replaced, the query's secret values are
    /// replaced as in a URL, and the fragment is dropped.
    pub(crate) fn redact_str(&self, raw: &str) -> String {
        if let Ok(url) = Url::parse(raw) {
            return self.redact(&url);
        }
        let raw = raw.split_once('#').map_or(raw, |(before, _)| before);
        let (head, query) = match raw.split_once('?') {
            Some((head, query)) => (head, Some(query)),
            None => (raw, None),
        };
        let mut out = match (head.find("://"), head.rfind('@')) {
            (Some(s), Some(at)) if at > s => {
                format!("{}{REDACTED}{}", &head[..s + 3], &head[at..])
            }
            (None, Some(at)) => format!("{REDACTED}{}", &head[at..]),
            _ => head.to_owned(),
        };
        if let Some(query) = query {
            out.push('?');
            out.push_str(&self.redact_query(query));
        }
        out
    }

    /// Free text with every URL in it (`scheme://...`, up to white space or
    /// a quote) redacted.
    pub fn redact_text(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(sep) = rest.find("://") {
            let scheme_start = rest[..sep]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
                .map_or(0, |i| i + 1);
            let after = &rest[sep + 3..];
            let len = after
                .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
                .unwrap_or(after.len());
            let mut end = sep + 3 + len;
            // Punctuation closing the sentence or a parenthesis around the URL.
            while end > sep + 3 {
                let last = rest[..end].chars().next_back().unwrap_or(' ');
                let open = rest[scheme_start..end].matches('(').count();
                let close = rest[scheme_start..end].matches(')').count();
                if matches!(last, '.' | ',' | ';' | ':' | ']') || (last == ')' && close > open) {
                    end -= last.len_utf8();
                } else {
                    break;
                }
            }
            out.push_str(&rest[..scheme_start]);
            let raw = &rest[scheme_start..end];
            match Url::parse(raw) {
                // Nothing to redact: keep the text as written (no
                // normalisation such as an added trailing `/`).
                Ok(url) if self.redact(&url) == url.as_str() => out.push_str(raw),
                _ if scheme_start == sep => out.push_str(raw),
                _ => out.push_str(&self.redact_str(raw)),
            }
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    /// The text of an error and its sources, `": "`-joined (a source's
    /// text left out when an outer one already contains it), for span
    /// status messages and `exception.message`. A `reqwest::Error` is
    /// described from its kind and its redacted URL, never by its own
    /// `Display` (which prints the full URL); every other text has its URLs
    /// redacted with [`redact_text`](Self::redact_text).
    pub fn error_text(&self, err: &(dyn StdError + 'static)) -> String {
        let mut text = String::new();
        let mut current = Some(err);
        while let Some(e) = current {
            let piece = match as_reqwest(e) {
                Some(r) => self.describe_reqwest(r),
                None => self.redact_text(&e.to_string()),
            };
            if !piece.is_empty() && !text.contains(&piece) {
                if !text.is_empty() {
                    text.push_str(": ");
                }
                text.push_str(&piece);
            }
            current = e.source();
        }
        text
    }

    /// reqwest's own message for `err`, rebuilt from its kind with the URL
    /// redacted.
    fn describe_reqwest(&self, err: &reqwest::Error) -> String {
        let mut text = if err.is_builder() {
            "builder error".to_owned()
        } else if err.is_redirect() {
            "error following redirect".to_owned()
        } else if let Some(status) = err.status() {
            let class = if status.is_client_error() {
                "client"
            } else {
                "server"
            };
            format!("HTTP status {class} error ({status})")
        } else if err.is_body() {
            "request or response body error".to_owned()
        } else if err.is_decode() {
            "error decoding response body".to_owned()
        } else if err.is_upgrade() {
            "error upgrading connection".to_owned()
        } else {
            "error sending request".to_owned()
        };
        if let Some(url) = err.url() {
            let _ = write!(text, " for url ({})", self.redact(url));
        }
        text
    }
}

/// The `reqwest::Error` `e` is or wraps transparently (reqwest-middleware's
/// `Error::Reqwest` prints the inner error's text and skips it in the chain).
fn as_reqwest<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a reqwest::Error> {
    if let Some(r) = e.downcast_ref::<reqwest::Error>() {
        return Some(r);
    }
    match e.downcast_ref::<reqwest_middleware::Error>() {
        Some(reqwest_middleware::Error::Reqwest(r)) => Some(r),
        _ => None,
    }
}

fn key_of(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(k, _)| k)
}

/// `url` as `url.full` carries it with the default [`UrlRedaction`]: user
/// name and password replaced by `REDACTED`, the values of the
/// [`DEFAULT_REDACTED_QUERY_KEYS`] replaced by `REDACTED`, the fragment
/// dropped.
pub fn redact_url(url: &Url) -> String {
    UrlRedaction::standard().redact(url)
}

/// [`UrlRedaction::redact_str`] with the default redaction.
pub(crate) fn redact_str(raw: &str) -> String {
    UrlRedaction::standard().redact_str(raw)
}

#[cfg(test)]
mod tests {
    use super::{UrlRedaction, redact_str, redact_url};
    use url::Url;

    #[test]
    fn the_shared_form_is_the_redacted_url() {
        let redaction = UrlRedaction::standard();
        for raw in [
            "https://example.com/p?x=1",
            "https://example.com/",
            "https://user:secret@example.com/p",
            "https://example.com/p?Signature=abc&x=1",
            "https://example.com/p#frag",
        ] {
            let url = Url::parse(raw).expect("valid url");
            assert_eq!(
                &*redaction.redact_shared(&url),
                redaction.redact(&url),
                "{raw}"
            );
        }
        let url = Url::parse("https://example.com/p?Signature=abc").expect("valid url");
        assert_eq!(
            &*redaction.redact_shared(&url),
            "https://example.com/p?Signature=REDACTED"
        );
    }

    #[test]
    fn credentials_and_signatures_are_redacted() {
        let url = Url::parse(
            "https://user:secret@example.com/p?AWSAccessKeyId=AKIA&Signature=abc&x=1#frag",
        )
        .expect("valid url");
        assert_eq!(
            redact_url(&url),
            "https://REDACTED:REDACTED@example.com/p?AWSAccessKeyId=REDACTED&Signature=REDACTED&x=1"
        );
    }

    #[test]
    fn percent_encoded_signed_keys_are_redacted() {
        let url = Url::parse("https://example.com/p?si%67=secret&x=1").expect("valid url");
        assert_eq!(redact_url(&url), "https://example.com/p?si%67=REDACTED&x=1");
    }

    #[test]
    fn cloud_and_oauth_keys_match_in_any_case() {
        let url = Url::parse(
            "https://b.s3.amazonaws.com/o?X-Amz-Credential=c&x-amz-signature=s&X-AMZ-SECURITY-TOKEN=t\
             &x-goog-credential=g&access_token=a&Api_Key=k&keep=v",
        )
        .expect("valid url");
        assert_eq!(
            redact_url(&url),
            "https://b.s3.amazonaws.com/o?X-Amz-Credential=REDACTED&x-amz-signature=REDACTED\
             &X-AMZ-SECURITY-TOKEN=REDACTED&x-goog-credential=REDACTED&access_token=REDACTED\
             &Api_Key=REDACTED&keep=v"
        );
    }

    #[test]
    fn added_keys_and_all_values() {
        let url = Url::parse("https://h/p?session=s&x=1&flag").expect("valid url");
        let added = UrlRedaction::new().add_query_key("Session");
        assert_eq!(added.redact(&url), "https://h/p?session=REDACTED&x=1&flag");
        let all = UrlRedaction::new().redact_all_query_values(true);
        assert_eq!(
            all.redact(&url),
            "https://h/p?session=REDACTED&x=REDACTED&flag"
        );
    }

    #[test]
    fn urls_inside_text_are_redacted() {
        let r = UrlRedaction::new();
        assert_eq!(
            r.redact_text("error for url (https://u:p@h/x?sig=S&a=1). next http://h2/?token=T"),
            "error for url (https://REDACTED:REDACTED@h/x?sig=REDACTED&a=1). next http://h2/?token=REDACTED"
        );
        assert_eq!(r.redact_text("no url: here"), "no url: here");
        assert_eq!(
            r.redact_text("(e.g. http://localhost:4317)"),
            "(e.g. http://localhost:4317)"
        );
        assert_eq!(r.redact_text("weird ://x"), "weird ://x");
    }

    #[test]
    fn unparseable_strings_lose_their_credentials() {
        assert_eq!(redact_str("http://u:p@[bad"), "http://REDACTED@[bad");
        // A mistyped URL (port out of range) still hides its secret query
        // values and its fragment; a `@` in the query is not user info.
        assert_eq!(
            redact_str("https://u:p@h:99999/x?token=T&a=1&X-AMZ-SIGNATURE=S&b=c@d#access_token=F"),
            "https://REDACTED@h:99999/x?token=REDACTED&a=1&X-AMZ-SIGNATURE=REDACTED&b=c@d"
        );
        assert_eq!(
            UrlRedaction::new().redact_text("invalid URL \"http://h:0x/?sig=S\": bad port"),
            "invalid URL \"http://h:0x/?sig=REDACTED\": bad port"
        );
        assert_eq!(
            redact_str("http://u:p@proxy:3128"),
            "http://REDACTED:REDACTED@proxy:3128/"
        );
    }

    #[test]
    fn plain_urls_pass_unchanged() {
        let url = Url::parse("http://127.0.0.1:8080/a?b=c").expect("valid url");
        assert_eq!(redact_url(&url), "http://127.0.0.1:8080/a?b=c");
    }
}
