//! Redirect hops as physical requests of their own.
//!
//! reqwest follows redirects inside one `execute` call (tower-http's
//! `FollowRedirect` around hyper-util's client), so a middleware sees one
//! call for a whole chain: one span, and only the last hop's connection in
//! the response's `HttpInfo`. The HTTP client semantic conventions (v1.42.0)
//! want one span per physical request, each redirect hop a resend with
//! `http.request.resend_count`.
//!
//! The instrumented builder therefore installs a `redirect::Policy::custom`
//! (see [`takeover_policy`]) that keeps reqwest's policy (`limited(n)`, the
//! default 10) but, for a request going through [`ConnTraceMiddleware`]
//! (the policy runs inside that request's poll, where the middleware has set
//! the current hop), records the hop's target and answers `stop`: reqwest
//! hands the 3xx response back, carrying the connection that served it, and
//! the middleware sends the next hop itself ([`Template::next_request`])
//! with the rules tower-http and reqwest apply (RFC 9110 §15.4: 301/302
//! turn POST into GET, 303 turns everything but HEAD into GET and drops the
//! body, 307/308 keep method and body; credentials dropped across hosts;
//! `Referer` when reqwest's `referer` is on; the request's extensions are
//! not carried over, as tower-http does not). Requests sent without the
//! middleware are followed by reqwest as before, under the same limit.
//!
//! [`ConnTraceMiddleware`]: crate::ConnTraceMiddleware

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HeaderValue,
    PROXY_AUTHORIZATION, REFERER, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use http::{Method, StatusCode};
use reqwest::Request;
use reqwest::redirect::{Action, Attempt, Policy};
use url::Url;

/// reqwest's default redirect limit (`redirect::Policy::default()`, reqwest
/// 0.13: 10 hops).
const REQWEST_DEFAULT_LIMIT: usize = 10;

/// The redirect policy the instrumented builder installs, read from
/// reqwest's builder (its `Debug` output, the only way to read it back):
/// `None` when reqwest must keep following by itself (`Policy::none()`, where
/// nothing is followed anyway, or a `Policy::custom` this crate cannot
/// evaluate across hops).
pub(crate) fn takeover_policy(described: &str) -> Option<Policy> {
    let limit = match described.split("redirect_policy: ").nth(1) {
        None => REQWEST_DEFAULT_LIMIT,
        Some(rest) => rest
            .strip_prefix("Policy(Limit(")?
            .split(')')
            .next()?
            .parse()
            .ok()?,
    };
    // reqwest's builder prints `referer: true` when enabled (its default).
    let referer = described.contains("referer: true");
    Some(Policy::custom(move |attempt| {
        decide(attempt, limit, referer)
    }))
}

fn decide(attempt: Attempt<'_>, limit: usize, referer: bool) -> Action {
    // The hop being polled, if this redirect answers it (and not another
    // request sent from inside its poll, e.g. by a later middleware).
    let hop = current().filter(|hop| {
        attempt
            .previous()
            .last()
            .is_some_and(|previous| same_target(previous, hop.template.request.url()))
    });
    match hop {
        Some(hop) => {
            // The chain so far: `followed` hops, then this one.
            if hop.followed >= limit {
                // reqwest turns this into its redirect error and drops the
                // response: the hop was answered all the same.
                let _ = hop.refused.set(attempt.status());
                return attempt.error(TooManyRedirects);
            }
            hop.set(Follow {
                url: attempt.url().clone(),
                referer,
            });
            attempt.stop()
        }
        // Not through the middleware: reqwest's `limited(n)` rule.
        None if attempt.previous().len() > limit => attempt.error(TooManyRedirects),
        None => attempt.follow(),
    }
}

/// The error of a chain longer than the limit (reqwest's own is private;
/// reqwest wraps this one so `reqwest::Error::is_redirect` holds).
#[derive(Debug)]
struct TooManyRedirects;

impl std::fmt::Display for TooManyRedirects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("too many redirects")
    }
}

impl std::error::Error for TooManyRedirects {}

/// Where the policy said to go next.
#[derive(Debug, Clone)]
pub(crate) struct Follow {
    url: Url,
    referer: bool,
}

/// One hop in flight: a copy of its request (its URL, and what the next
/// hop is built from), how many hops came before it, and the policy's
/// verdict.
#[derive(Debug)]
pub(crate) struct HopSlot {
    template: Template,
    followed: usize,
    next: Mutex<Option<Follow>>,
    /// The status of the redirect the limit refused: the hop's response
    /// came, and reqwest answers its call with the redirect error instead.
    refused: std::sync::OnceLock<StatusCode>,
}

/// Whether two URLs name the same request target (what reqwest's policy
/// reports went through `http::Uri`: no credentials, no fragment).
fn same_target(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
        && a.path() == b.path()
        && a.query() == b.query()
}

impl HopSlot {
    /// The slot of the hop sending `request` after `followed` followed
    /// redirects.
    pub(crate) fn new(request: &Request, followed: usize) -> Self {
        Self {
            template: Template::of(request),
            followed,
            next: Mutex::new(None),
            refused: std::sync::OnceLock::new(),
        }
    }

    /// `error`, a later hop's failure, as reqwest reports it when it follows
    /// the redirects itself: with this hop's URL (the call's own, this
    /// being its first hop), as reqwest sets the request's URL on an error
    /// that carries none. Not for its redirect errors (their URL is the
    /// redirecting hop's) or for a hop that could not be built (its URL is
    /// the rejected one).
    pub(crate) fn as_reqwest_reports(
        &self,
        error: reqwest_middleware::Error,
    ) -> reqwest_middleware::Error {
        match error {
            reqwest_middleware::Error::Reqwest(e) if !e.is_redirect() && !e.is_builder() => {
                reqwest_middleware::Error::Reqwest(e.with_url(self.template.request.url().clone()))
            }
            other => other,
        }
    }

    /// The status of this hop's redirect response when the redirect limit
    /// refused to follow it (the call fails with reqwest's redirect error,
    /// though the hop was answered).
    pub(crate) fn refused_by_limit(&self) -> Option<StatusCode> {
        self.refused.get().copied()
    }

    fn set(&self, follow: Follow) {
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(follow);
    }

    /// The redirect to follow, if the policy said so.
    fn take(&self) -> Option<Follow> {
        self.next.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The next hop's request after this hop's `status` response, if the
    /// policy said to follow and the redirect can be followed (see
    /// [`Template::next_request`]).
    pub(crate) fn next_request(&self, status: StatusCode) -> Option<Request> {
        let follow = self.take()?;
        self.template.try_clone()?.next_request(status, follow)
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<HopSlot>>> = const { RefCell::new(None) };
}

fn current() -> Option<Arc<HopSlot>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Makes `hop` the current one on this thread until dropped.
pub(crate) struct HopScope {
    previous: Option<Arc<HopSlot>>,
}

impl HopScope {
    pub(crate) fn enter(hop: &Arc<HopSlot>) -> Self {
        let previous = CURRENT
            .try_with(|c| c.borrow_mut().replace(hop.clone()))
            .ok()
            .flatten();
        Self { previous }
    }
}

impl Drop for HopScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
    }
}

/// A copy of a request taken before it is sent, to build the next hop from.
#[derive(Debug)]
struct Template {
    request: Request,
    /// The body could not be copied (a stream): 307/308 cannot be followed.
    body_lost: bool,
}

impl Template {
    /// Another copy of the copy, to build the next hop from (only when a
    /// redirect is followed). `None` only if the copy's body cannot be
    /// copied, which [`Template::of`] rules out.
    fn try_clone(&self) -> Option<Self> {
        Some(Self {
            request: self.request.try_clone()?,
            body_lost: self.body_lost,
        })
    }

    /// Copies `request`: method, URL, headers, version, timeout, and its
    /// body when it is in memory. Not its extensions (reqwest's own
    /// following, tower-http's `FollowRedirect`, does not carry them to the
    /// next hop either).
    ///
    /// Built field by field: `Request::try_clone` allocates a timeout slot
    /// even for a request without a timeout, and this runs for every
    /// request sent.
    fn of(request: &Request) -> Self {
        let mut copy = Request::new(request.method().clone(), request.url().clone());
        *copy.headers_mut() = request.headers().clone();
        *copy.version_mut() = request.version();
        if let Some(timeout) = request.timeout() {
            *copy.timeout_mut() = Some(*timeout);
        }
        let mut body_lost = false;
        if request.body().is_some() {
            // reqwest's `Body::try_clone` is private: the body of a whole
            // copy (in memory: a shared buffer; a stream: no copy).
            match request.try_clone().and_then(|mut r| r.body_mut().take()) {
                Some(body) => *copy.body_mut() = Some(body),
                None => body_lost = true,
            }
        }
        Self {
            request: copy,
            body_lost,
        }
    }

    /// The next hop's request after a `status` response, or `None` when the
    /// redirect cannot be followed (not a redirect status, or a 307/308 whose
    /// body could not be copied: the 3xx is then the answer, as in reqwest).
    fn next_request(self, status: StatusCode, follow: Follow) -> Option<Request> {
        let Self {
            mut request,
            body_lost,
        } = self;
        let drop_body = |request: &mut Request| {
            *request.body_mut() = None;
            for name in [
                CONTENT_TYPE,
                CONTENT_LENGTH,
                CONTENT_ENCODING,
                TRANSFER_ENCODING,
            ] {
                request.headers_mut().remove(name);
            }
        };
        match status {
            StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => {
                if request.method() == Method::POST {
                    *request.method_mut() = Method::GET;
                    drop_body(&mut request);
                } else if body_lost {
                    return None;
                }
            }
            StatusCode::SEE_OTHER => {
                if request.method() != Method::HEAD {
                    *request.method_mut() = Method::GET;
                }
                drop_body(&mut request);
            }
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT if !body_lost => {}
            _ => return None,
        }
        let previous = request.url().clone();
        let next = follow.url;
        let cross_host = next.host_str() != previous.host_str()
            || next.port_or_known_default() != previous.port_or_known_default()
            || next.scheme() != previous.scheme();
        if cross_host {
            let headers = request.headers_mut();
            for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, WWW_AUTHENTICATE] {
                headers.remove(name);
            }
            headers.remove("cookie2");
        }
        if follow.referer
            && let Some(value) = referer(&next, &previous)
        {
            request.headers_mut().insert(REFERER, value);
        }
        *request.url_mut() = next;
        Some(request)
    }
}

/// reqwest's `Referer` for a hop: the previous URL without credentials or
/// fragment, none on an https to http downgrade.
fn referer(next: &Url, previous: &Url) -> Option<HeaderValue> {
    if next.scheme() == "http" && previous.scheme() == "https" {
        return None;
    }
    let mut referer = previous.clone();
    let _ = referer.set_username("");
    let _ = referer.set_password(None);
    referer.set_fragment(None);
    referer.as_str().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn follow(url: &str) -> Follow {
        Follow {
            url: Url::parse(url).expect("test value"),
            referer: true,
        }
    }

    #[test]
    fn reads_the_limit_set_on_reqwests_builder() {
        let described = |b: reqwest::ClientBuilder| format!("{b:?}");
        assert!(takeover_policy(&described(reqwest::Client::builder())).is_some());
        assert!(
            takeover_policy(&described(
                reqwest::Client::builder().redirect(Policy::limited(3))
            ))
            .is_some()
        );
        assert!(
            takeover_policy(&described(
                reqwest::Client::builder().redirect(Policy::none())
            ))
            .is_none()
        );
        assert!(
            takeover_policy(&described(
                reqwest::Client::builder().redirect(Policy::custom(|a| a.follow()))
            ))
            .is_none()
        );
    }

    #[test]
    fn post_after_302_becomes_a_get_without_body_and_credentials_stay_on_their_host() {
        let mut request = Request::new(
            Method::POST,
            Url::parse("http://127.0.0.1:8080/a").expect("test value"),
        );
        *request.body_mut() = Some("x".into());
        request
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        request
            .headers_mut()
            .insert(AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        let next = Template::of(&request)
            .next_request(StatusCode::FOUND, follow("http://127.0.0.2:8080/b"))
            .expect("test value");
        assert_eq!(next.method(), Method::GET);
        assert!(next.body().is_none());
        assert!(next.headers().get(CONTENT_TYPE).is_none());
        assert!(next.headers().get(AUTHORIZATION).is_none());
        assert_eq!(next.url().as_str(), "http://127.0.0.2:8080/b");
        assert_eq!(
            next.headers().get(REFERER).expect("test value"),
            "http://127.0.0.1:8080/a"
        );
    }

    #[test]
    fn a_307_keeps_method_and_body_and_same_host_keeps_credentials() {
        let mut request = Request::new(Method::PUT, Url::parse("https://h/a").expect("test value"));
        *request.body_mut() = Some("x".into());
        request
            .headers_mut()
            .insert(AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        let next = Template::of(&request)
            .next_request(StatusCode::TEMPORARY_REDIRECT, follow("https://h/b"))
            .expect("test value");
        assert_eq!(next.method(), Method::PUT);
        assert_eq!(next.body().and_then(|b| b.as_bytes()), Some(&b"x"[..]));
        assert!(next.headers().get(AUTHORIZATION).is_some());
    }

    #[test]
    fn not_a_redirect_status_is_not_followed() {
        let request = Request::new(Method::GET, Url::parse("http://h/").expect("test value"));
        assert!(
            Template::of(&request)
                .next_request(StatusCode::OK, follow("http://h/x"))
                .is_none()
        );
    }
}
