//! The DNS resolver wrapper: times the lookup inside the connect that asked
//! for it and records the answers in the order returned.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::connect::attempt::{self, DnsPhase};
use crate::error::{DnsError, classify, error_chain_text};

/// A [`Resolve`] that records each lookup on the connect that triggered it
/// (the `dns.lookup` span) and delegates to an inner resolver: the user's own,
/// or [`SystemResolver`].
///
/// Names answered by `ClientBuilder::resolve` overrides never reach a
/// resolver (reqwest applies overrides first), so they produce no
/// `dns.lookup` span; the setup span then carries
/// `http.connection.dns_skipped = "override"`.
#[derive(Clone)]
pub struct TracedResolver {
    inner: Arc<dyn Resolve>,
    order: AddressOrder,
}

/// The order in which resolved addresses are handed to the connector.
///
/// hyper-util's connector (reqwest's) tries the addresses of the *first*
/// address's family one after another (each with an equal share of the
/// connect timeout), and starts on the other family 300 ms later if none has
/// connected yet (Happy Eyeballs, RFC 6555 / RFC 8305). So the first address
/// decides which family is preferred.
///
/// Trade-off (incident 4): with [`Keep`](Self::Keep) a resolver that answers
/// IPv6 first makes every connect wait on IPv6; where IPv6 drops SYNs each
/// new connection pays the 300 ms fallback delay, or a 1 s / 3 s SYN
/// retransmit when no IPv4 address is left to race.
/// [`Ipv4First`](Self::Ipv4First) avoids that on hosts whose IPv6 path is
/// broken, at the price of never preferring a working IPv6 path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AddressOrder {
    /// The resolver's order (`getaddrinfo` applies RFC 6724). Default.
    #[default]
    Keep,
    /// IPv4 addresses first (in the resolver's order), IPv6 after them as
    /// the Happy Eyeballs fallback.
    Ipv4First,
    /// IPv6 addresses first, IPv4 after them as the fallback.
    Ipv6First,
}

impl AddressOrder {
    /// The `http.connection.address_order` value: `keep`, `ipv4_first` or
    /// `ipv6_first`.
    pub fn as_str(self) -> &'static str {
        match self {
            AddressOrder::Keep => "keep",
            AddressOrder::Ipv4First => "ipv4_first",
            AddressOrder::Ipv6First => "ipv6_first",
        }
    }

    /// Reorders `addrs` by this policy; a stable partition, so the order
    /// within each family is the resolver's.
    pub fn apply(self, addrs: &[SocketAddr]) -> Vec<SocketAddr> {
        let (v4, v6): (Vec<SocketAddr>, Vec<SocketAddr>) = addrs.iter().partition(|a| a.is_ipv4());
        match self {
            AddressOrder::Keep => addrs.to_vec(),
            AddressOrder::Ipv4First => v4.into_iter().chain(v6).collect(),
            AddressOrder::Ipv6First => v6.into_iter().chain(v4).collect(),
        }
    }
}

impl std::str::FromStr for AddressOrder {
    type Err = String;

    /// Parses `keep`, `ipv4-first` / `ipv4_first` or `ipv6-first` / `ipv6_first`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "keep" => Ok(AddressOrder::Keep),
            "ipv4-first" | "ipv4_first" => Ok(AddressOrder::Ipv4First),
            "ipv6-first" | "ipv6_first" => Ok(AddressOrder::Ipv6First),
            other => Err(format!(
                "unknown address order `{other}` (expected keep, ipv4-first or ipv6-first)"
            )),
        }
    }
}

impl std::fmt::Debug for TracedResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracedResolver").finish_non_exhaustive()
    }
}

impl TracedResolver {
    /// Wraps `inner`, keeping its address order.
    pub fn new(inner: Arc<dyn Resolve>) -> Self {
        Self {
            inner,
            order: AddressOrder::Keep,
        }
    }

    /// Reorders every answer by `order` before the connector sees it.
    /// Default: [`AddressOrder::Keep`].
    pub fn address_order(mut self, order: AddressOrder) -> Self {
        self.order = order;
        self
    }

    /// Wraps [`SystemResolver`], the equivalent of reqwest's default.
    pub fn system() -> Self {
        Self::new(Arc::new(SystemResolver))
    }
}

impl Resolve for TracedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let asked = Instant::now();
        let host = name.as_str().to_owned();
        let current = attempt::with_current(|a| a.clone());
        if let Some(a) = &current {
            a.phases().dns = Some(DnsPhase {
                name: host.clone(),
                asked,
                began: None,
                answered: None,
                answers: Vec::new(),
                connect_order: Vec::new(),
                order: self.order,
                error: None,
            });
        }
        let order = self.order;
        let lookup = self.inner.resolve(name);
        Box::pin(async move {
            let result = lookup.await;
            let answered = Instant::now();
            let Some(a) = current else {
                return result.map(|addrs| {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    Box::new(order.apply(&addrs).into_iter()) as Addrs
                });
            };
            match result {
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    let ordered = order.apply(&addrs);
                    if let Some(d) = a.phases().dns.as_mut() {
                        d.answered = Some(answered);
                        d.answers = addrs;
                        d.connect_order = ordered.clone();
                    }
                    Ok(Box::new(ordered.into_iter()) as Addrs)
                }
                Err(e) => {
                    if let Some(d) = a.phases().dns.as_mut() {
                        d.answered = Some(answered);
                        d.error = Some((
                            classify(e.as_ref()),
                            error_chain_text(crate::redact::UrlRedaction::standard(), e.as_ref()),
                        ));
                    }
                    Err(e)
                }
            }
        })
    }
}

/// The system resolver (`getaddrinfo` on tokio's blocking pool), like
/// reqwest's default. It also records when the lookup actually began on a
/// blocking thread, so that time spent queueing behind a saturated pool shows
/// on the `dns.lookup` span as a `dns.lookup_began` event.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let current = attempt::with_current(|a| a.clone());
        Box::pin(async move {
            let lookup_host = host.clone();
            let handle = tokio::task::spawn_blocking(move || {
                let began = Instant::now();
                if let Some(a) = &current
                    && let Some(d) = a.phases().dns.as_mut()
                {
                    d.began = Some(began);
                }
                (lookup_host.as_str(), 0u16).to_socket_addrs()
            });
            match handle.await {
                Ok(Ok(addrs)) => Ok(Box::new(addrs) as Addrs),
                Ok(Err(source)) => Err(Box::new(DnsError { name: host, source }) as _),
                Err(join) => Err(Box::new(DnsError {
                    name: host,
                    source: std::io::Error::other(join.to_string()),
                }) as _),
            }
        })
    }
}
