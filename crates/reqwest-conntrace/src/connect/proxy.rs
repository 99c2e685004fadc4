//! Which proxy a connect went through, judged from what the connect did,
//! and what a refused `CONNECT` looks like.
//!
//! reqwest decides the proxy inside its connector, below our layer: the
//! layer is handed the target only. What the connect itself shows is:
//! - the address its socket connected to (hyper-util's `HttpInfo` once
//!   connected; the address in a refused connect's `ConnectError`; the
//!   kernel's answer for a handshake that hung, see `peer`);
//! - the name the connector asked our resolver for: the target's for a
//!   direct connect, the proxy's through a proxy (reqwest never resolves
//!   the target of a `CONNECT` tunnel nor of an absolute-form request);
//! - reqwest's own mark on an absolute-form (plain `http`) proxy
//!   connection (`Connected::is_proxied`), and an error from hyper-util's
//!   `CONNECT` tunnel.
//!
//! A connect is proxied when that evidence says so: its socket went to
//! an address that is not the target's, or it resolved another host's
//! name, or reqwest marked it, or the tunnel failed. The client's
//! configured proxies ([`ProxyRules`], read once after reqwest built the
//! client) *name* the proxy the evidence points at, and decide that a
//! connect was proxied only where nothing on the wire showed an address
//! and hyper-util's matcher (the one reqwest routes with: the builder's
//! proxy or the environment's) intercepts the target (a `CONNECT` the
//! proxy never answered, TLS refused inside the tunnel):
//! - the instrumented builder's [`proxy`](crate::InstrumentedClientBuilder::proxy):
//!   every target;
//! - the environment (`ALL_PROXY`, `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`,
//!   lower case too), which reqwest reads at build unless a proxy was set on
//!   its builder or `no_proxy()` was called: the very matcher reqwest uses
//!   (hyper-util's `Matcher::from_system`), recognised in the built client's
//!   `Debug` output, the only place reqwest shows its proxy list;
//! - proxies set with reqwest's own `ClientBuilder::proxy`: their proxy URLs
//!   per target scheme, read from that same output (their `no_proxy`
//!   exclusions are not printed there: the wire tells an excluded host's
//!   direct connect apart); a `Proxy::custom` closure prints nothing of
//!   its proxy, which is then named from the address connected to (or
//!   the name resolved).

use std::net::{IpAddr, SocketAddr};

use hyper_util::client::proxy::matcher::Matcher;

use crate::pool::host::HostKey;

/// The proxy a connect went through, as its evidence showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyRoute {
    /// The proxy's host as configured (a name or an IP literal), or the
    /// name resolved / address connected to; `None` when nothing named it.
    pub(crate) host: Option<String>,
    /// The proxy's port, when known.
    pub(crate) port: Option<u16>,
    /// `https` target: a `CONNECT` tunnel (RFC 9110 §9.3.6); else the
    /// request is forwarded in absolute form.
    pub(crate) tunnel: bool,
}

/// A proxy the client's configuration names for a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyCandidate {
    /// Host as configured (a name or an IP literal, no brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl ProxyCandidate {
    fn of(uri: &http::Uri) -> Option<Self> {
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        Some(Self {
            host: bare(uri.host()?).to_owned(),
            port,
        })
    }

    /// Whether a socket connected to `peer` reached this proxy: same port,
    /// and the same IP literal, or a name that was resolved in this connect
    /// (`resolved`) or not at all (an override: only the port tells).
    fn reached(&self, peer: SocketAddr, resolved: Option<&str>) -> bool {
        if self.port != peer.port() {
            return false;
        }
        match self.host.parse::<IpAddr>() {
            Ok(ip) => ip == peer.ip(),
            Err(_) => resolved.is_none_or(|n| same_host(n, &self.host)),
        }
    }
}

/// The proxies that may route a connect to one target, by the client's
/// configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Candidates {
    /// Configured proxies for the target's scheme (first match first).
    pub(crate) known: Vec<ProxyCandidate>,
    /// A proxy the configuration does not show may route it (reqwest's
    /// `Proxy::custom`, or a client whose rules were never read).
    pub(crate) unknown: bool,
    /// hyper-util's matcher, the very one reqwest routes with (the
    /// instrumented builder's proxy, or the environment's with its
    /// `NO_PROXY`), intercepts the target: `known` holds its proxy, and
    /// the connect went through it even when nothing on the wire showed
    /// it (a `CONNECT` that hung, TLS refused inside the tunnel).
    pub(crate) matched: bool,
}

impl Candidates {
    /// Nothing known of the client's proxies.
    pub(crate) fn unknown() -> Self {
        Self {
            known: Vec::new(),
            unknown: true,
            matched: false,
        }
    }
}

/// One proxy entry of reqwest's builder.
#[derive(Debug)]
pub(crate) enum Listed {
    /// `Proxy::http/https/all`: the proxy for `http` targets and for
    /// `https` targets.
    Uris(Option<http::Uri>, Option<http::Uri>),
    /// `Proxy::custom`: a closure whose proxy is not shown.
    Custom,
}

/// A client's proxy rules.
#[derive(Debug, Default)]
pub(crate) enum ProxyRules {
    /// No proxy.
    #[default]
    None,
    /// hyper-util's matcher: the builder's proxy or the environment's.
    Matcher(Box<Matcher>),
    /// Proxies from reqwest's builder, in its order.
    Listed(Vec<Listed>),
}

impl ProxyRules {
    /// The rules of the instrumented builder's proxy (`Proxy::all`).
    pub(crate) fn all(url: &url::Url) -> Self {
        Self::Matcher(Box::new(Matcher::builder().all(url.to_string()).build()))
    }

    /// The rules of a client reqwest built, from its `Debug` output.
    pub(crate) fn of_client(client: &reqwest::Client) -> Self {
        let described = format!("{client:?}");
        let Some(list) = described.split("proxies: [").nth(1) else {
            return Self::None;
        };
        let system = Matcher::from_system();
        let described_system = format!("{system:?}");
        if list.starts_with(&format!("{described_system}]")) {
            // No proxy for http nor https in the environment: the matcher
            // routes nothing, so no rules (and no lookup per connect).
            if !described_system.contains("Intercept") {
                return Self::None;
            }
            return Self::Matcher(Box::new(system));
        }
        let entries: Vec<Listed> = top_level_entries(list)
            .into_iter()
            .filter_map(|entry| {
                if entry == "_" {
                    return Some(Listed::Custom);
                }
                // `Matcher { http: Intercept { uri: U }, https: Intercept { uri: V }, .. }`
                let uri = |field: &str| {
                    entry
                        .split(&format!("{field}: Intercept {{ uri: "))
                        .nth(1)?
                        .split([' ', ','])
                        .next()?
                        .parse::<http::Uri>()
                        .ok()
                };
                let (http, https) = (uri("http"), uri("https"));
                (http.is_some() || https.is_some()).then_some(Listed::Uris(http, https))
            })
            .collect();
        if entries.is_empty() {
            Self::None
        } else {
            Self::Listed(entries)
        }
    }

    /// The proxies that may route a connect to `target`.
    pub(crate) fn candidates(&self, target: &HostKey) -> Candidates {
        let tunnel = &*target.scheme == "https";
        match self {
            Self::None => Candidates::default(),
            Self::Matcher(m) => {
                let host = if target.host.contains(':') {
                    format!("[{}]", target.host)
                } else {
                    target.host.to_string()
                };
                let known = format!("{}://{host}:{}/", target.scheme, target.port)
                    .parse::<http::Uri>()
                    .ok()
                    .and_then(|dst| ProxyCandidate::of(m.intercept(&dst)?.uri()))
                    .into_iter()
                    .collect::<Vec<_>>();
                Candidates {
                    matched: !known.is_empty(),
                    known,
                    unknown: false,
                }
            }
            Self::Listed(entries) => {
                let mut c = Candidates::default();
                for entry in entries {
                    match entry {
                        Listed::Uris(h, s) => c.known.extend(
                            if tunnel { s } else { h }
                                .as_ref()
                                .and_then(ProxyCandidate::of),
                        ),
                        Listed::Custom => c.unknown = true,
                    }
                }
                c
            }
        }
    }
}

/// The `, `-separated entries of a `Debug` list up to its closing `]`.
fn top_level_entries(list: &str) -> Vec<&str> {
    let (mut depth, mut start, mut entries) = (0usize, 0, Vec::new());
    for (i, ch) in list.char_indices() {
        match ch {
            '{' | '[' | '(' => depth += 1,
            '}' | ')' => depth = depth.saturating_sub(1),
            ']' if depth == 0 => {
                entries.push(list[start..i].trim());
                return entries;
            }
            ']' => depth -= 1,
            ',' if depth == 0 => {
                entries.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    entries
}

fn bare(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

fn same_host(a: &str, b: &str) -> bool {
    bare(a).eq_ignore_ascii_case(bare(b))
}

/// What one connect showed about where it went.
#[derive(Debug, Default)]
pub(crate) struct Evidence<'a> {
    /// The target (the request's scheme, host and port).
    pub(crate) target: Option<&'a HostKey>,
    /// The name our resolver was asked in this connect, and the addresses
    /// handed to the connector.
    pub(crate) resolved: Option<(&'a str, &'a [SocketAddr])>,
    /// The address the socket connected to (or whose connect was refused).
    pub(crate) peer: Option<SocketAddr>,
    /// reqwest marked the connection as an absolute-form proxy's.
    pub(crate) forwarded: bool,
    /// hyper-util's `CONNECT` tunnel failed (connecting to the proxy, or
    /// the proxy's answer).
    pub(crate) tunnel_failed: bool,
}

impl Evidence<'_> {
    /// Whether the socket's peer is the target: `None` when the target's
    /// addresses are not known here (a name no resolver of ours was
    /// asked for: an override, or a proxy that resolves it).
    fn peer_is_target(&self, peer: SocketAddr) -> Option<bool> {
        let target = self.target?;
        if let Ok(ip) = bare(&target.host).parse::<IpAddr>() {
            return Some(peer == SocketAddr::new(ip, target.port));
        }
        let (name, addrs) = self.resolved?;
        if !same_host(name, &target.host) {
            // The connector resolved another host: the proxy's.
            return Some(false);
        }
        Some(
            addrs.contains(&peer)
                || (peer.port() == target.port && addrs.iter().any(|a| a.ip() == peer.ip())),
        )
    }

    /// The proxy this connect went through, `None` when it went direct or
    /// nothing shows a proxy.
    pub(crate) fn route(&self, candidates: &Candidates) -> Option<ProxyRoute> {
        let resolved_name = self.resolved.map(|(n, _)| n);
        let resolved_other = self
            .resolved
            .zip(self.target)
            .is_some_and(|((n, _), t)| !same_host(n, &t.host));
        let reached = |p: SocketAddr| {
            candidates
                .known
                .iter()
                .find(|c| c.reached(p, resolved_name))
        };
        // With no address seen, the matcher reqwest routes with decides.
        let proxied = self.forwarded
            || self.tunnel_failed
            || (self.peer.is_none() && candidates.matched)
            || match self.peer {
                Some(p) => match self.peer_is_target(p) {
                    Some(is_target) => !is_target,
                    None => {
                        reached(p).is_some()
                            || (candidates.unknown
                                && self.target.is_some_and(|t| t.port != p.port()))
                    }
                },
                None => resolved_other,
            };
        if !proxied {
            return None;
        }
        let tunnel = !self.forwarded && self.target.is_some_and(|t| &*t.scheme == "https");
        let named = |c: &ProxyCandidate| ProxyRoute {
            host: Some(c.host.clone()),
            port: Some(c.port),
            tunnel,
        };
        if let Some(c) = self.peer.and_then(reached) {
            return Some(named(c));
        }
        // The name the connector resolved instead of the target's (or the
        // target's own name on another port: a proxy on the same host).
        if let Some(name) = resolved_name.filter(|_| {
            resolved_other
                || self
                    .peer
                    .zip(self.target)
                    .is_some_and(|(p, t)| p.port() != t.port)
        }) {
            let port = self.peer.map(|p| p.port()).or_else(|| {
                candidates
                    .known
                    .iter()
                    .find(|c| same_host(&c.host, name))
                    .map(|c| c.port)
            });
            return Some(ProxyRoute {
                host: Some(name.to_owned()),
                port,
                tunnel,
            });
        }
        if let Some(p) = self.peer {
            return Some(ProxyRoute {
                host: Some(p.ip().to_string()),
                port: Some(p.port()),
                tunnel,
            });
        }
        // Proxied by the tunnel's own error, with no address seen: the one
        // configured proxy, if there is exactly one.
        match (&candidates.known[..], candidates.unknown) {
            ([only], false) => Some(named(only)),
            _ => Some(ProxyRoute {
                host: None,
                port: None,
                tunnel,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(scheme: &str, host: &str, port: u16) -> HostKey {
        HostKey::new(scheme, host, port)
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    fn candidate(host: &str, port: u16) -> ProxyCandidate {
        ProxyCandidate {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn the_builders_proxy_is_a_candidate_for_every_target() {
        let rules = ProxyRules::all(&url::Url::parse("http://127.0.0.1:3128").expect("test value"));
        for scheme in ["https", "http"] {
            assert_eq!(
                rules.candidates(&key(scheme, "example.test", 443)),
                Candidates {
                    known: vec![candidate("127.0.0.1", 3128)],
                    unknown: false,
                    matched: true,
                }
            );
        }
    }

    #[test]
    fn proxies_set_on_reqwests_builder_are_read_from_the_client() {
        let client = crate::ConnTrace::new()
            .instrument_client(
                reqwest::Client::builder()
                    .proxy(reqwest::Proxy::https("http://10.1.2.3:8080").expect("test value"))
                    .proxy(reqwest::Proxy::custom(|_| None::<url::Url>)),
            )
            .build()
            .expect("test value");
        let rules = ProxyRules::of_client(&client);
        assert_eq!(
            rules.candidates(&key("https", "example.test", 443)),
            Candidates {
                known: vec![candidate("10.1.2.3", 8080)],
                unknown: true,
                matched: false,
            }
        );
        assert_eq!(
            rules.candidates(&key("http", "example.test", 80)),
            Candidates {
                known: vec![],
                unknown: true,
                matched: false,
            }
        );
    }

    #[test]
    fn no_proxy_on_reqwests_builder_means_none() {
        let client = crate::ConnTrace::new()
            .instrument_client(reqwest::Client::builder().no_proxy())
            .build()
            .expect("test value");
        assert!(matches!(ProxyRules::of_client(&client), ProxyRules::None));
    }

    #[test]
    fn the_system_proxy_gives_rules_only_when_the_environment_names_one() {
        let client = crate::ConnTrace::new()
            .instrument_client(reqwest::Client::builder())
            .build()
            .expect("test value");
        let environment_names_one = (0..2).any(|i| {
            let url = format!("{}://192.0.2.1/", ["http", "https"][i]);
            Matcher::from_system()
                .intercept(&url.parse().expect("test value"))
                .is_some()
        });
        let rules = ProxyRules::of_client(&client);
        if environment_names_one {
            assert!(matches!(rules, ProxyRules::Matcher(_)));
        } else {
            assert!(matches!(rules, ProxyRules::None));
        }
    }

    /// A configured proxy whose connect went to the target itself (a
    /// `no_proxy` exclusion) is not a route; one whose socket reached the
    /// proxy is, named as configured.
    #[test]
    fn the_address_connected_to_decides_not_the_configuration() {
        let target = key("https", "localhost", 8443);
        let configured = Candidates {
            known: vec![candidate("127.0.0.1", 3128)],
            unknown: false,
            matched: false,
        };
        let answers = [addr("127.0.0.1:0"), addr("[::1]:0")];
        let direct = Evidence {
            target: Some(&target),
            resolved: Some(("localhost", &answers)),
            peer: Some(addr("127.0.0.1:8443")),
            ..Evidence::default()
        };
        assert_eq!(direct.route(&configured), None);
        let tunnel = Evidence {
            target: Some(&target),
            peer: Some(addr("127.0.0.1:3128")),
            ..Evidence::default()
        };
        assert_eq!(
            tunnel.route(&configured),
            Some(ProxyRoute {
                host: Some("127.0.0.1".into()),
                port: Some(3128),
                tunnel: true
            })
        );
        // An override (no lookup) to an address no proxy has: direct.
        let overridden = Evidence {
            target: Some(&target),
            peer: Some(addr("10.0.0.7:8443")),
            ..Evidence::default()
        };
        assert_eq!(overridden.route(&configured), None);
    }

    /// A `Proxy::custom` proxy is named from the wire: the address
    /// connected to, or the name resolved instead of the target's.
    #[test]
    fn an_unshown_proxy_is_named_from_the_wire() {
        let target = key("https", "localhost", 8443);
        let custom = Candidates::unknown();
        let by_ip = Evidence {
            target: Some(&target),
            peer: Some(addr("127.0.0.1:3128")),
            ..Evidence::default()
        };
        assert_eq!(
            by_ip.route(&custom),
            Some(ProxyRoute {
                host: Some("127.0.0.1".into()),
                port: Some(3128),
                tunnel: true
            })
        );
        let answers = [addr("10.0.0.1:0")];
        let by_name = Evidence {
            target: Some(&target),
            resolved: Some(("proxy.test", &answers)),
            peer: Some(addr("10.0.0.1:3128")),
            ..Evidence::default()
        };
        assert_eq!(
            by_name.route(&custom).and_then(|r| r.host),
            Some("proxy.test".into())
        );
        // The target's own port with no lookup: an override, not a proxy.
        let same_port = Evidence {
            target: Some(&target),
            peer: Some(addr("10.0.0.1:8443")),
            ..Evidence::default()
        };
        assert_eq!(same_port.route(&custom), None);
    }

    /// A refused TCP connect inside the tunnel: proxied by the tunnel's
    /// error, named by the refused address.
    #[test]
    fn a_failed_tunnel_is_proxied() {
        let target = key("https", "localhost", 8443);
        let refused = Evidence {
            target: Some(&target),
            peer: Some(addr("127.0.0.1:9")),
            tunnel_failed: true,
            ..Evidence::default()
        };
        assert_eq!(
            refused.route(&Candidates::default()),
            Some(ProxyRoute {
                host: Some("127.0.0.1".into()),
                port: Some(9),
                tunnel: true
            })
        );
        let answered = Evidence {
            target: Some(&target),
            tunnel_failed: true,
            ..Evidence::default()
        };
        assert_eq!(
            answered
                .route(&Candidates {
                    known: vec![candidate("proxy.test", 3128)],
                    unknown: false,
                    matched: false,
                })
                .and_then(|r| r.port),
            Some(3128)
        );
    }

    /// With no address seen and nothing resolved (a proxy given by IP
    /// whose `CONNECT` hung, or TLS refused inside its tunnel), the
    /// matcher reqwest routes with decides: a target it intercepts went
    /// through its proxy; proxies listed on reqwest's builder (their
    /// exclusions unseen) decide nothing.
    #[test]
    fn with_no_address_seen_the_matcher_reqwest_routes_with_decides() {
        let target = key("https", "localhost", 8443);
        let nothing_seen = Evidence {
            target: Some(&target),
            ..Evidence::default()
        };
        let matched =
            ProxyRules::all(&url::Url::parse("http://127.0.0.1:3128").expect("test value"))
                .candidates(&target);
        assert_eq!(
            nothing_seen.route(&matched),
            Some(ProxyRoute {
                host: Some("127.0.0.1".into()),
                port: Some(3128),
                tunnel: true,
            })
        );
        let listed = Candidates {
            matched: false,
            ..matched
        };
        assert_eq!(nothing_seen.route(&listed), None);
    }
}
