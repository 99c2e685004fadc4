//! The DNS resolver wrapper: times the lookup inside the connect that asked
//! for it and records the answers in the order returned.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Instant;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::connect::address::AddressOrder;
use crate::connect::attempt::{self, DnsPhase};
use crate::error::{classify, error_chain_text};
use crate::pool::answers::NewestAnswers;

/// A [`Resolve`] that records each lookup on the connect that triggered it
/// (the `dns.lookup` span) and delegates to an inner resolver: the user's own,
/// or [`SystemResolver`].
///
/// Names answered by `ClientBuilder::resolve` overrides never reach a
/// resolver (reqwest applies overrides first), so they produce no
/// `dns.lookup` span; the setup span then carries
/// `http.connection.dns_skipped = "override"`.
///
/// It also keeps its own newest answer per host name (clones share it):
/// a request on a pooled connection whose peer address is not in it gets
/// `http.connection.dns_stale = true`. A client built by
/// [`InstrumentedClientBuilder`](crate::InstrumentedClientBuilder) has its
/// own `TracedResolver`, so its connections are judged by its own
/// resolver's answers only.
#[derive(Clone)]
pub struct TracedResolver {
    inner: Arc<dyn Resolve>,
    order: AddressOrder,
    newest: Arc<NewestAnswers>,
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
            newest: Arc::default(),
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
                newest: None,
            });
        }
        let order = self.order;
        let newest = Arc::clone(&self.newest);
        let lookup = self.inner.resolve(name);
        Box::pin(async move {
            let result = lookup.await;
            let answered = Instant::now();
            let Some(a) = current else {
                return result.map(|addrs| {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    // The resolver's newest answer, whoever asked.
                    let _ = newest.record(&host, &addrs);
                    Box::new(order.apply(&addrs).into_iter()) as Addrs
                });
            };
            match result {
                Ok(addrs) => {
                    let addrs: Vec<SocketAddr> = addrs.collect();
                    let ordered = order.apply(&addrs);
                    let entry = newest.record(&host, &addrs);
                    if let Some(d) = a.phases().dns.as_mut() {
                        d.answered = Some(answered);
                        d.answers = addrs;
                        d.connect_order = ordered.clone();
                        d.newest = entry;
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
            let handle = tokio::task::spawn_blocking(move || {
                let began = Instant::now();
                if let Some(a) = &current
                    && let Some(d) = a.phases().dns.as_mut()
                {
                    d.began = Some(began);
                }
                (host.as_str(), 0u16).to_socket_addrs()
            });
            // A failed lookup's error as reqwest's default resolver
            // (hyper-util's `GaiResolver`) gives it: the lookup's own
            // `io::Error` (one cancelled with its runtime: `Interrupted`),
            // unwrapped, so a request's error chain is the plain client's.
            match handle.await {
                Ok(Ok(addrs)) => Ok(Box::new(addrs) as Addrs),
                Ok(Err(error)) => Err(Box::new(error) as _),
                Err(join) => {
                    Err(Box::new(std::io::Error::new(std::io::ErrorKind::Interrupted, join)) as _)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lookup that fails fails as with reqwest's default resolver
    /// (hyper-util's `GaiResolver`): the same error, no layer of ours. A
    /// NUL byte in the name fails the lookup before any query (std's
    /// lookup needs a C string): no network.
    #[tokio::test]
    async fn a_failed_lookup_fails_as_reqwests_default_resolver_does() {
        let ours = SystemResolver
            .resolve("a\0b".parse().expect("name"))
            .await
            .err()
            .expect("the lookup fails");
        let mut gai = hyper_util::client::legacy::connect::dns::GaiResolver::new();
        let theirs = tower_service::Service::call(&mut gai, "a\0b".parse().expect("name"))
            .await
            .expect_err("the lookup fails");
        assert_eq!(ours.to_string(), theirs.to_string());
        assert!(ours.downcast_ref::<std::io::Error>().is_some(), "{ours:?}");
        assert!(ours.source().is_none(), "{ours:?}");
    }
}
