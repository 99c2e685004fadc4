//! Which resolved address a connect used and what became of the ones tried
//! before it, read from hyper-util's documented connect order (there is no
//! per-attempt hook), the SYN retransmissions a connect waited out, and the
//! order the resolved addresses are handed to the connector in
//! ([`AddressOrder`]).

use std::net::SocketAddr;
use std::time::Duration;

use crate::semconv;

/// hyper-util's Happy Eyeballs delay before the other family is tried
/// (`HttpConnector::set_happy_eyeballs_timeout`, default 300 ms).
pub(crate) const HAPPY_EYEBALLS_DELAY: Duration = Duration::from_millis(300);

/// Linux sends the first SYN retransmission 1 s after the SYN
/// (`TCP_TIMEOUT_INIT`, RFC 6298 §2.1) and doubles the timeout each time:
/// retransmissions at 1, 3, 7, 15, 31 and 63 s after the first SYN
/// (`net.ipv4.tcp_syn_retries` = 6 by default).
pub(crate) const SYN_RETRANSMIT_AT: [Duration; 6] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(7),
    Duration::from_secs(15),
    Duration::from_secs(31),
    Duration::from_secs(63),
];

/// SYN retransmissions a single-address connect that took `duration` must
/// have waited out (a SYN-ACK cannot arrive before the SYN that got it).
pub(crate) fn syn_retransmits_by_timing(duration: Duration) -> usize {
    SYN_RETRANSMIT_AT
        .iter()
        .take_while(|at| duration >= **at)
        .count()
}

/// The order hyper-util tries `addrs` in: every address of the first
/// address's family, in order, then (from 300 ms on, in parallel) the other
/// family's.
pub(crate) fn attempt_order(addrs: &[SocketAddr]) -> Vec<SocketAddr> {
    let Some(first) = addrs.first() else {
        return Vec::new();
    };
    let preferred_v4 = first.is_ipv4();
    let (preferred, fallback): (Vec<SocketAddr>, Vec<SocketAddr>) =
        addrs.iter().partition(|a| a.is_ipv4() == preferred_v4);
    preferred.into_iter().chain(fallback).collect()
}

/// An address tried before the one that connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkippedAddress {
    pub(crate) addr: SocketAddr,
    /// One of the `semconv::ADDRESS_OUTCOME_*` values.
    pub(crate) outcome: &'static str,
    /// For `timed_out`: when the connector gave up on it, from the phase start.
    pub(crate) gave_up_after: Option<Duration>,
}

/// How the winning address was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddressChoice {
    /// Position of the winner in the connector's order.
    pub(crate) index: usize,
    pub(crate) skipped: Vec<SkippedAddress>,
}

/// Explains how `winner` was reached among `order` (the addresses handed
/// to the connector), given the TCP phase's `duration` and the client's
/// connect timeout. `None` when the winner is not among them (e.g. a proxy).
pub(crate) fn explain_choice(
    order: &[SocketAddr],
    winner: SocketAddr,
    duration: Duration,
    connect_timeout: Option<Duration>,
) -> Option<AddressChoice> {
    let attempts = attempt_order(order);
    let index = attempts.iter().position(|a| a.ip() == winner.ip())?;
    let winner_v4 = winner.is_ipv4();
    let family_size = attempts
        .iter()
        .filter(|a| a.is_ipv4() == winner_v4)
        .count()
        .max(1);
    // hyper-util gives each address of a family an equal share of the
    // connect timeout.
    let share = connect_timeout.and_then(|t| t.checked_div(family_size as u32));
    let first_v4 = attempts.first().is_some_and(|a| a.is_ipv4());
    let winner_in_fallback = winner_v4 != first_v4;
    let mut same_family_before = 0u32;
    let skipped = attempts[..index]
        .iter()
        .map(|addr| {
            let outcome = if addr.is_ipv4() != winner_v4 {
                // The preferred family did not connect: it either failed
                // before the Happy Eyeballs delay (then the fallback starts
                // at once) or was still trying when the fallback won.
                if winner_in_fallback && duration >= HAPPY_EYEBALLS_DELAY {
                    semconv::ADDRESS_OUTCOME_OUTRACED
                } else {
                    semconv::ADDRESS_OUTCOME_FAILED
                }
            } else {
                same_family_before += 1;
                let elapsed = if winner_in_fallback {
                    duration.saturating_sub(HAPPY_EYEBALLS_DELAY)
                } else {
                    duration
                };
                match share {
                    Some(s)
                        if elapsed.as_secs_f64()
                            >= 0.95 * s.as_secs_f64() * f64::from(same_family_before) =>
                    {
                        let offset = if winner_in_fallback {
                            HAPPY_EYEBALLS_DELAY
                        } else {
                            Duration::ZERO
                        };
                        return SkippedAddress {
                            addr: *addr,
                            outcome: semconv::ADDRESS_OUTCOME_TIMED_OUT,
                            gave_up_after: Some(offset + s * same_family_before),
                        };
                    }
                    _ => semconv::ADDRESS_OUTCOME_FAILED,
                }
            };
            SkippedAddress {
                addr: *addr,
                outcome,
                gave_up_after: None,
            }
        })
        .collect();
    Some(AddressChoice { index, skipped })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn syn_retransmits_follow_the_linux_schedule() {
        assert_eq!(syn_retransmits_by_timing(Duration::from_millis(999)), 0);
        assert_eq!(syn_retransmits_by_timing(Duration::from_millis(1006)), 1);
        assert_eq!(syn_retransmits_by_timing(Duration::from_millis(3010)), 2);
        assert_eq!(syn_retransmits_by_timing(Duration::from_millis(7100)), 3);
    }

    #[test]
    fn the_first_family_is_tried_first() {
        let order = [a("[::1]:1"), a("127.0.0.1:1"), a("[::2]:1")];
        assert_eq!(
            attempt_order(&order),
            vec![a("[::1]:1"), a("[::2]:1"), a("127.0.0.1:1")]
        );
    }

    #[test]
    fn ipv4_winning_after_the_happy_eyeballs_delay_outraced_ipv6() {
        let order = [a("[::1]:443"), a("127.0.0.1:443")];
        let choice = explain_choice(&order, a("127.0.0.1:443"), Duration::from_millis(310), None)
            .expect("winner among the answers");
        assert_eq!(choice.index, 1);
        assert_eq!(
            choice.skipped,
            vec![SkippedAddress {
                addr: a("[::1]:443"),
                outcome: semconv::ADDRESS_OUTCOME_OUTRACED,
                gave_up_after: None,
            }]
        );
    }

    #[test]
    fn a_dead_address_of_the_same_family_timed_out_its_share() {
        let order = [a("127.0.0.2:80"), a("127.0.0.1:80")];
        let timed_out = explain_choice(
            &order,
            a("127.0.0.1:80"),
            Duration::from_millis(502),
            Some(Duration::from_secs(1)),
        )
        .expect("winner among the answers");
        assert_eq!(
            timed_out.skipped[0].outcome,
            semconv::ADDRESS_OUTCOME_TIMED_OUT
        );
        assert_eq!(
            timed_out.skipped[0].gave_up_after,
            Some(Duration::from_millis(500))
        );
        let refused = explain_choice(
            &order,
            a("127.0.0.1:80"),
            Duration::from_millis(3),
            Some(Duration::from_secs(1)),
        )
        .expect("winner among the answers");
        assert_eq!(refused.skipped[0].outcome, semconv::ADDRESS_OUTCOME_FAILED);
    }

    #[test]
    fn a_winner_outside_the_answers_is_not_explained() {
        assert_eq!(
            explain_choice(
                &[a("10.0.0.1:80")],
                a("127.0.0.1:3128"),
                Duration::ZERO,
                None
            ),
            None
        );
    }
}
