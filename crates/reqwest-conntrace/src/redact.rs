//! `url.full` redaction per the OpenTelemetry URL semantic conventions.

use url::Url;

/// Query parameters whose values the URL semantic conventions (v1.42.0,
/// `url.full`) require to be redacted: signed-URL credentials of AWS, Google
/// Cloud and Azure.
const SIGNED_QUERY_KEYS: &[&str] = &["AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature"];

/// The replacement the conventions prescribe.
const REDACTED: &str = "REDACTED";

/// Returns `url` as `url.full` may carry it: user name and password replaced
/// by `REDACTED`, and the values of signed-URL query parameters
/// (`AWSAccessKeyId`, `Signature`, `sig`, `X-Goog-Signature`) replaced by
/// `REDACTED`. Fragments are dropped (they are never sent).
pub fn redact_url(url: &Url) -> String {
    let mut out = url.clone();
    out.set_fragment(None);
    if !out.username().is_empty() {
        // Errors only for cannot-be-a-base URLs, which carry no credentials.
        let _ = out.set_username(REDACTED);
    }
    if out.password().is_some() {
        let _ = out.set_password(Some(REDACTED));
    }
    if let Some(query) = url.query()
        && SIGNED_QUERY_KEYS
            .iter()
            .any(|k| url.query_pairs().any(|(name, _)| name == *k))
    {
        // Compare decoded keys (`si%67` is `sig`), keep the sent spelling.
        let redacted: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_signed_key(k) => format!("{k}={REDACTED}"),
                _ => pair.to_owned(),
            })
            .collect();
        out.set_query(Some(&redacted.join("&")));
    }
    out.to_string()
}

fn is_signed_key(raw: &str) -> bool {
    url::form_urlencoded::parse(raw.as_bytes())
        .next()
        .is_some_and(|(k, _)| SIGNED_QUERY_KEYS.contains(&k.as_ref()))
}

/// [`redact_url`] for a string that may not be a valid URL (e.g. a proxy
/// URL in an error message): anything before an `@` in the authority is
/// replaced when it does not parse.
pub(crate) fn redact_str(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(url) => redact_url(&url),
        Err(_) => match (raw.find("://"), raw.rfind('@')) {
            (Some(s), Some(at)) if at > s => format!("{}{REDACTED}{}", &raw[..s + 3], &raw[at..]),
            (None, Some(at)) => format!("{REDACTED}{}", &raw[at..]),
            _ => raw.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{redact_str, redact_url};
    use url::Url;

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
    fn unparseable_strings_lose_their_credentials() {
        assert_eq!(redact_str("http://u:p@[bad"), "http://REDACTED@[bad");
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
