//! The newest DNS answer per host name, per resolver: what
//! `http.connection.dns_stale` judges a pooled connection's peer against.
//!
//! Each [`TracedResolver`](crate::TracedResolver) (one per client built by
//! [`InstrumentedClientBuilder`](crate::InstrumentedClientBuilder); its
//! clones share it) keeps its own table: two clients with resolvers that
//! answer the same name differently do not judge each other's
//! connections. The newest answer is the latest successful lookup's,
//! recorded when the resolver answers, whatever the connects to it did
//! (an answer whose addresses all refuse still makes the pooled
//! connections to the old address stale: that is a failover in progress).
//! Every connection made from a lookup holds its host's entry, so a
//! request reads the answer as it stands at that moment: a connection
//! whose address leaves the answer is stale, and stops being stale when
//! the address comes back.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// The newest answer of one resolver for one host name, shared by that
/// resolver's table and every connection made from one of its answers for
/// the name.
#[derive(Debug)]
pub(crate) struct HostAnswer {
    /// Its addresses, in the resolver's order. Written once per lookup (a
    /// swap), read once per reused request: the lock is never held longer
    /// than a scan of a few addresses.
    addresses: Mutex<Box<[IpAddr]>>,
}

impl HostAnswer {
    fn new(addresses: Box<[IpAddr]>) -> Self {
        Self {
            addresses: Mutex::new(addresses),
        }
    }

    fn addresses(&self) -> MutexGuard<'_, Box<[IpAddr]>> {
        self.addresses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest answer holds `ip`.
    pub(crate) fn holds(&self, ip: IpAddr) -> bool {
        self.addresses().contains(&ip)
    }

    fn replace(&self, addresses: Box<[IpAddr]>) {
        // The old answer is freed after the lock is released.
        let _old = std::mem::replace(&mut *self.addresses(), addresses);
    }
}

/// One resolver's newest answers, by host name. Only names some live
/// connection (or lookup in flight) still holds are kept: the table is
/// pruned of the others whenever it has doubled since the last pruning.
#[derive(Debug, Default)]
pub(crate) struct NewestAnswers {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    hosts: HashMap<Box<str>, Weak<HostAnswer>>,
    /// Prune when `hosts` grows past this many names.
    prune_above: usize,
}

/// The table is never pruned below this many names.
const PRUNE_FLOOR: usize = 64;

impl NewestAnswers {
    /// Records a successful lookup of `name`: its addresses become the
    /// newest answer for every connection made from an answer of this
    /// resolver for `name`. Returns the entry, for the connection this
    /// lookup's connect may make. `None` for an empty answer (no address
    /// to judge by: the previous answer stays the newest).
    pub(crate) fn record(&self, name: &str, answers: &[SocketAddr]) -> Option<Arc<HostAnswer>> {
        if answers.is_empty() {
            return None;
        }
        let addresses: Box<[IpAddr]> = answers.iter().map(SocketAddr::ip).collect();
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = table.hosts.get(name).and_then(Weak::upgrade) {
            entry.replace(addresses);
            return Some(entry);
        }
        let entry = Arc::new(HostAnswer::new(addresses));
        table.hosts.insert(name.into(), Arc::downgrade(&entry));
        if table.hosts.len() > table.prune_above.max(PRUNE_FLOOR) {
            table.hosts.retain(|_, e| e.strong_count() > 0);
            table.prune_above = 2 * table.hosts.len();
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(last: u8) -> Vec<SocketAddr> {
        vec![SocketAddr::from(([127, 0, 0, last], 0))]
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_later_answer_replaces_the_one_a_connection_holds() {
        let table = NewestAnswers::default();
        let held = table.record("a.test", &answer(1)).expect("an answer");
        assert!(held.holds(ip(1)));
        let _ = table.record("a.test", &answer(2));
        assert!(!held.holds(ip(1)));
        assert!(held.holds(ip(2)));
        let _ = table.record("a.test", &answer(1));
        assert!(held.holds(ip(1)), "back in the newest answer");
    }

    #[test]
    fn names_and_tables_are_apart() {
        let one = NewestAnswers::default();
        let other = NewestAnswers::default();
        let a = one.record("a.test", &answer(1)).expect("an answer");
        let _b = one.record("b.test", &answer(2));
        let _c = other.record("a.test", &answer(3));
        assert!(a.holds(ip(1)));
    }

    #[test]
    fn an_empty_answer_keeps_the_newest() {
        let table = NewestAnswers::default();
        let held = table.record("a.test", &answer(1)).expect("an answer");
        assert!(table.record("a.test", &[]).is_none());
        assert!(held.holds(ip(1)));
    }

    #[test]
    fn names_no_connection_holds_are_pruned() {
        let table = NewestAnswers::default();
        let held = table.record("kept.test", &answer(1)).expect("an answer");
        for i in 0..10 * PRUNE_FLOOR {
            let _ = table.record(&format!("h{i}.test"), &answer(2));
        }
        let t = table.table.lock().expect("lock");
        assert!(t.hosts.len() <= PRUNE_FLOOR + 1, "{}", t.hosts.len());
        assert!(
            t.hosts
                .get("kept.test")
                .is_some_and(|e| e.upgrade().is_some())
        );
        drop(t);
        assert!(held.holds(ip(1)));
    }
}
