//! `--resolve HOST:PORT:ADDR[,ADDR...]`: curl's syntax for pinning a host
//! name to addresses, answered by [`PinnedResolver`], a static resolver
//! handed to the instrumented client's `dns_resolver`. Unlike reqwest's
//! `resolve_to_addrs` overrides (which bypass the resolver), the pinned
//! answers go through the library's resolver wrapper: the `dns.lookup` span
//! (~0 ms) records them, `--address-order` reorders them, and the connect's
//! address fallback (`http.connection.address_fallback`,
//! `tcp.address_skipped`) is visible.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest_conntrace::SystemResolver;
use url::Url;

/// One parsed `--resolve` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolveEntry {
    /// The host name the entry applies to (compared case-insensitively).
    pub(crate) host: String,
    /// The port the entry applies to (curl semantics: `HOST:PORT` must match the URL).
    pub(crate) port: u16,
    /// The addresses to connect to, tried in this order.
    pub(crate) addrs: Vec<IpAddr>,
}

impl ResolveEntry {
    /// Whether this entry applies to `url` (same host, same effective port).
    pub(crate) fn matches(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else {
            return false;
        };
        host.eq_ignore_ascii_case(&self.host) && url.port_or_known_default() == Some(self.port)
    }
}

/// A resolver answering the `--resolve` host names from their entries, the
/// addresses in the order given (like a DNS server returning those records);
/// every other name goes to the system resolver ([`SystemResolver`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct PinnedResolver {
    /// Lower-cased host name to its addresses, in order.
    names: Arc<HashMap<String, Vec<IpAddr>>>,
    /// The resolver for names without an entry.
    system: SystemResolver,
}

impl PinnedResolver {
    /// A resolver answering the hosts of `entries` (entries naming the same
    /// host add their addresses after the earlier ones').
    pub(crate) fn new(entries: &[ResolveEntry]) -> Self {
        let mut names: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for e in entries {
            let addrs = names.entry(e.host.to_ascii_lowercase()).or_default();
            for a in &e.addrs {
                if !addrs.contains(a) {
                    addrs.push(*a);
                }
            }
        }
        Self {
            names: Arc::new(names),
            system: SystemResolver,
        }
    }

    /// A resolver answering `name` with `addrs`, in that order (the lab's
    /// host names; the port comes from the URL).
    pub(crate) fn single(name: &str, addrs: &[IpAddr]) -> Self {
        let mut names = HashMap::new();
        names.insert(name.to_ascii_lowercase(), addrs.to_vec());
        Self {
            names: Arc::new(names),
            system: SystemResolver,
        }
    }

    /// The pinned addresses of `host`, if it has an entry.
    fn lookup(&self, host: &str) -> Option<Vec<IpAddr>> {
        self.names.get(&host.to_ascii_lowercase()).cloned()
    }
}

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        match self.lookup(name.as_str()) {
            // Port 0: hyper-util puts the URL's port in (and the entry's
            // port is the URL's: entries for other ports are dropped).
            Some(addrs) => Box::pin(std::future::ready(Ok(Box::new(
                addrs
                    .into_iter()
                    .map(|ip| SocketAddr::new(ip, 0))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ) as Addrs))),
            None => self.system.resolve(name),
        }
    }
}

impl std::fmt::Display for ResolveEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:", self.host, self.port)?;
        for (i, a) in self.addrs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match a {
                IpAddr::V4(v4) => write!(f, "{v4}")?,
                IpAddr::V6(v6) => write!(f, "[{v6}]")?,
            }
        }
        Ok(())
    }
}

/// Parses `HOST:PORT:ADDR[,ADDR...]` (IPv6 addresses in brackets, a
/// leading `+` accepted and ignored as curl does). Used as clap's value parser.
///
/// # Errors
/// A one-line description of what is wrong with `text`.
pub(crate) fn parse(text: &str) -> Result<ResolveEntry, String> {
    const SHAPE: &str = "expected HOST:PORT:ADDR[,ADDR...], e.g. example.com:443:127.0.0.1 or example.com:443:[::1],127.0.0.1";
    let text = text.trim().strip_prefix('+').unwrap_or(text.trim());
    let mut parts = text.splitn(3, ':');
    let (Some(host), Some(port), Some(addrs)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(SHAPE.to_owned());
    };
    if host.is_empty() {
        return Err(format!("empty host name; {SHAPE}"));
    }
    if host == "*" {
        return Err("wildcard host `*` is not supported; name the host".to_owned());
    }
    if host.starts_with('[') {
        return Err("the host must be a name (an IP literal needs no --resolve)".to_owned());
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("invalid port {port:?}; {SHAPE}"))?;
    if port == 0 {
        return Err("port 0 is not a valid port".to_owned());
    }
    let addrs = addrs
        .split(',')
        .map(|a| {
            let a = a.trim();
            let bare = a
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .unwrap_or(a);
            bare.parse::<IpAddr>()
                .map_err(|_| format!("invalid address {a:?} (IPv6 goes in brackets: [::1])"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if addrs.is_empty() {
        return Err(format!("no address given; {SHAPE}"));
    }
    Ok(ResolveEntry {
        host: host.to_owned(),
        port,
        addrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_curl_syntax() {
        let e = parse("example.com:443:[::1],127.0.0.1").ok();
        assert_eq!(
            e,
            Some(ResolveEntry {
                host: "example.com".into(),
                port: 443,
                addrs: vec![
                    IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
                    IpAddr::from([127, 0, 0, 1])
                ],
            })
        );
        assert!(parse("+h:80:10.0.0.1").is_ok());
        assert!(parse("h:80").is_err());
        assert!(parse("h:x:1.2.3.4").is_err());
        assert!(parse("h:80:nope").is_err());
        assert!(parse(":80:1.2.3.4").is_err());
        assert!(parse("*:80:1.2.3.4").is_err());
    }

    #[tokio::test]
    async fn pinned_names_answer_in_the_given_order() {
        let entries = [
            parse("Example.com:443:[::1],127.0.0.1").expect("entry"),
            parse("example.com:443:10.0.0.1,127.0.0.1").expect("entry"),
        ];
        let resolver = PinnedResolver::new(&entries);
        let name: Name = "EXAMPLE.com".parse().expect("name");
        let addrs: Vec<SocketAddr> = resolver.resolve(name).await.expect("pinned").collect();
        let want: Vec<SocketAddr> = ["[::1]:0", "127.0.0.1:0", "10.0.0.1:0"]
            .iter()
            .map(|a| a.parse().expect("addr"))
            .collect();
        assert_eq!(addrs, want);
        // Other names go to the system resolver.
        let name: Name = "localhost".parse().expect("name");
        let addrs: Vec<SocketAddr> = resolver.resolve(name).await.expect("system").collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        assert!(!addrs.is_empty());
    }
}
