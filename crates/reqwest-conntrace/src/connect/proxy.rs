//! Which proxy a connect goes through, however the proxy was configured,
//! and what a refused `CONNECT` looks like.
//!
//! reqwest decides the proxy inside its connector, out of our sight; the
//! connector layer only sees the target. So the client's rules are rebuilt
//! here, once, after reqwest built the client:
//! - the instrumented builder's [`proxy`](crate::InstrumentedClientBuilder::proxy):
//!   every target;
//! - the environment (`ALL_PROXY`, `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY`,
//!   lower case too), which reqwest reads at build unless a proxy was set on
//!   its builder or `no_proxy()` was called: the very matcher reqwest uses
//!   (hyper-util's `Matcher::from_system`), recognised in the built client's
//!   `Debug` output, the only place reqwest shows its proxy list;
//! - proxies set with reqwest's own `ClientBuilder::proxy`: their proxy URLs
//!   per target scheme, read from that same output (their `no_proxy`
//!   exclusions are not printed there, so they count as matching every host).

use hyper_util::client::proxy::matcher::Matcher;

use crate::pool::host::HostKey;

/// The proxy a connect to one target goes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyRoute {
    /// The proxy's host as configured (a name or an IP literal).
    pub(crate) host: String,
    /// The proxy's port.
    pub(crate) port: u16,
    /// `https` target: a `CONNECT` tunnel (RFC 9110 §9.3.6); else the
    /// request is forwarded in absolute form.
    pub(crate) tunnel: bool,
}

/// A client's proxy rules.
#[derive(Debug, Default)]
pub(crate) enum ProxyRules {
    /// No proxy (or none this crate can see).
    #[default]
    None,
    /// hyper-util's matcher: the builder's proxy or the environment's.
    Matcher(Box<Matcher>),
    /// Proxies from reqwest's builder, first match wins: per entry, the
    /// proxy for `http` targets and for `https` targets.
    Listed(Vec<(Option<http::Uri>, Option<http::Uri>)>),
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
        // `Matcher { http: Intercept { uri: U }, https: Intercept { uri: V }, .. }`
        // per entry.
        let entries = list
            .split("Matcher")
            .skip(1)
            .map(|entry| {
                let uri = |field: &str| {
                    entry
                        .split(&format!("{field}: Intercept {{ uri: "))
                        .nth(1)?
                        .split([' ', ','])
                        .next()?
                        .parse::<http::Uri>()
                        .ok()
                };
                (uri("http"), uri("https"))
            })
            .filter(|(a, b)| a.is_some() || b.is_some())
            .collect::<Vec<_>>();
        if entries.is_empty() {
            Self::None
        } else {
            Self::Listed(entries)
        }
    }

    /// The proxy for `target`, if any.
    pub(crate) fn route(&self, target: &HostKey) -> Option<ProxyRoute> {
        let tunnel = &*target.scheme == "https";
        let uri = match self {
            Self::None => return None,
            Self::Matcher(m) => {
                let host = if target.host.contains(':') {
                    format!("[{}]", target.host)
                } else {
                    target.host.to_string()
                };
                let dst: http::Uri = format!("{}://{host}:{}/", target.scheme, target.port)
                    .parse()
                    .ok()?;
                m.intercept(&dst)?.uri().clone()
            }
            Self::Listed(entries) => entries
                .iter()
                .find_map(|(h, s)| if tunnel { s.clone() } else { h.clone() })?,
        };
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("https") => 443,
            _ => 80,
        });
        Some(ProxyRoute {
            host: uri
                .host()?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            tunnel,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(scheme: &str, host: &str, port: u16) -> HostKey {
        HostKey::new(scheme, host, port)
    }

    #[test]
    fn the_builders_proxy_routes_every_target() {
        let rules = ProxyRules::all(&url::Url::parse("http://127.0.0.1:3128").expect("test value"));
        let route = rules
            .route(&key("https", "example.test", 443))
            .expect("test value");
        assert_eq!(
            route,
            ProxyRoute {
                host: "127.0.0.1".into(),
                port: 3128,
                tunnel: true
            }
        );
        assert!(
            !rules
                .route(&key("http", "example.test", 80))
                .expect("test value")
                .tunnel
        );
    }

    #[test]
    fn proxies_set_on_reqwests_builder_are_read_from_the_client() {
        let client = crate::ConnTrace::new()
            .instrument_client(
                reqwest::Client::builder()
                    .proxy(reqwest::Proxy::https("http://10.1.2.3:8080").expect("test value")),
            )
            .build()
            .expect("test value");
        let rules = ProxyRules::of_client(&client);
        let route = rules
            .route(&key("https", "example.test", 443))
            .expect("test value");
        assert_eq!((route.host.as_str(), route.port), ("10.1.2.3", 8080));
        assert!(rules.route(&key("http", "example.test", 80)).is_none());
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
}
