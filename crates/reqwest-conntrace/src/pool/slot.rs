//! The miss of one connect: its reason, the previous connection it blames,
//! and the slot the triggering request and the new connection share while
//! the kernel is asked.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::inferred::LimitSource;

/// A connection whose end (or state) caused a miss: the facts named on
/// the request as `http.connection.previous.*`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Previous {
    pub(crate) id: u64,
    /// End of its last response (or its ready time) to the miss.
    pub(crate) idle: Duration,
    pub(crate) request_count: u64,
    /// How it ended; `None` while it is alive (`release_race`).
    pub(crate) end: Option<ConnectionEnd>,
    /// The server ended it (dated by the kernel's report of its socket's
    /// end) after the client's pool had kept it idle longer than the
    /// keep-alive timeout the server advertised (this value), under a
    /// client idle timeout this crate could not read: evidence that the
    /// client's timeout is the longer one (see
    /// [`EVENT_KEEP_ALIVE_MISMATCH`](crate::semconv::EVENT_KEEP_ALIVE_MISMATCH)).
    pub(crate) kept_past_keep_alive: Option<Duration>,
    /// This client has logged no keep-alive mismatch WARN line yet: the
    /// miss recording this one logs it.
    pub(crate) warn_keep_alive: bool,
}

/// A miss's reason and the connection that caused it, if one did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Miss {
    pub(crate) reason: MissReason,
    pub(crate) previous: Option<Previous>,
    /// The host is not (fully) in the pool history: `reason` is not known,
    /// the request says `http.connection.untracked = pool_history`.
    pub(crate) untracked: bool,
    /// The decision depended on a pool limit this crate could not read
    /// (set on reqwest's builder), inferred or not:
    /// `http.connection.pool.limits = inferred | unknown`.
    pub(crate) limits: Option<LimitSource>,
    /// `idle_expired` under an inferred idle timeout: the client's idle
    /// timeout as inferred so far (`http.connection.client_idle_timeout`).
    pub(crate) inferred_idle_timeout: Option<Duration>,
}

impl Miss {
    pub(crate) fn new(reason: MissReason) -> Self {
        Self {
            reason,
            previous: None,
            untracked: false,
            limits: None,
            inferred_idle_timeout: None,
        }
    }

    pub(crate) fn caused_by(reason: MissReason, previous: Previous) -> Self {
        Self {
            previous: Some(previous),
            ..Self::new(reason)
        }
    }

    pub(crate) fn untracked() -> Self {
        Self {
            untracked: true,
            ..Self::new(MissReason::Cold)
        }
    }

    pub(crate) fn limits_unknown(self) -> Self {
        Self {
            limits: Some(LimitSource::Unknown),
            ..self
        }
    }

    /// This miss as the request it was for can tell it once its response
    /// came on connection `served_by`, as that connection's
    /// `request_count`th request: a miss that named that very connection
    /// as ended (the idle limit, the pool's close) was wrong about it. The
    /// checkout found it missing, yet hyper-util handed it to the waiting
    /// checkout as it came back (its `put` serves a waiting checkout
    /// before it counts the idle limit). When this request is the first
    /// it carried after the one the miss counted, it was alive and on its
    /// way back: hyper-util's release race (REFERENCE section 14). When it
    /// carried another request in between, it was busy at the miss (the
    /// belief in its close was wrong): every connection was in use,
    /// `all_busy`, and no connection ended. Any other miss is returned as
    /// it is.
    pub(crate) fn served_by(self, served_by: u64, request_count: u64) -> Self {
        match self.previous {
            Some(previous) if previous.id == served_by && previous.end.is_some() => {
                if request_count == previous.request_count + 1 {
                    Self::caused_by(
                        MissReason::ReleaseRace,
                        Previous {
                            end: None,
                            ..previous
                        },
                    )
                } else {
                    Self::new(MissReason::AllBusy)
                }
            }
            _ => self,
        }
    }

    /// The reason rests on a limit inferred from the client's closes.
    pub(crate) fn limits_inferred(self) -> Self {
        Self {
            limits: Some(LimitSource::Inferred),
            ..self
        }
    }
}

/// What to do with the miss once the kernel has answered.
type Waiter = Box<dyn FnOnce(Miss) + Send>;

/// The miss of one connect, shared by the request that triggered it and the
/// connection it made: decided at once from the pool history (held by
/// value: most misses, and nothing allocated for them), or pending the
/// kernel's answer (shared, filled when it arrives).
#[derive(Debug, Clone)]
pub(crate) enum MissSlot {
    Decided(Miss),
    Pending(Arc<PendingMiss>),
}

impl MissSlot {
    /// The miss, or the fallback if the kernel has not answered yet.
    pub(crate) fn get(&self) -> Miss {
        match self {
            MissSlot::Decided(miss) => *miss,
            MissSlot::Pending(pending) => pending.get(),
        }
    }

    /// The HTTP/2 connection a miss asked the kernel about: the host's
    /// shared one, which hyper-util's checkout found unusable (it checks
    /// out a shared HTTP/2 connection whatever its streams, so its server
    /// was refusing new ones after GOAWAY, or it had closed).
    pub(crate) fn http2_candidate(&self) -> Option<u64> {
        match self {
            MissSlot::Pending(pending) => pending.http2_candidate,
            MissSlot::Decided(_) => None,
        }
    }

    /// Whether the miss is known (decided at once, or the kernel answered).
    pub(crate) fn is_settled(&self) -> bool {
        match self {
            MissSlot::Decided(_) => true,
            MissSlot::Pending(pending) => pending.is_settled(),
        }
    }

    /// Runs `then` with the miss once it is known: at once if it is,
    /// otherwise when the kernel answers (the kernel view always answers,
    /// within its 1 s queue limit). Nothing waits: a request that ended
    /// before the answer records its miss from here.
    pub(crate) fn when_settled(&self, then: impl FnOnce(Miss) + Send + 'static) {
        match self {
            MissSlot::Decided(miss) => then(*miss),
            MissSlot::Pending(pending) => pending.when_settled(then),
        }
    }

    /// The same miss, held by value once the kernel has answered: what a
    /// connection keeps for its lifetime (the shared slot and its waiters
    /// are freed with the request).
    pub(crate) fn settled(self) -> Self {
        match &self {
            MissSlot::Pending(pending) => match pending.miss.get() {
                Some(miss) => MissSlot::Decided(*miss),
                None => self,
            },
            MissSlot::Decided(_) => self,
        }
    }
}

/// A miss waiting for the kernel's answer: see [`MissSlot::Pending`].
pub(crate) struct PendingMiss {
    miss: OnceLock<Miss>,
    /// Used if the kernel has not answered in time.
    fallback: Miss,
    /// Run once the miss is known ([`when_settled`](Self::when_settled)).
    waiters: Mutex<Vec<Waiter>>,
    /// The id of the HTTP/2 connection the kernel is asked about: the
    /// pool's shared one for the host, which hyper-util found unusable
    /// (see [`http2_candidate`](MissSlot::http2_candidate)).
    http2_candidate: Option<u64>,
}

impl std::fmt::Debug for PendingMiss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingMiss")
            .field("miss", &self.miss.get())
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl PendingMiss {
    /// A miss asked about an HTTP/2 candidate whose id is
    /// `http2_candidate` (`None`: HTTP/1.1), `fallback` until it is known.
    pub(crate) fn asking_about(fallback: Miss, http2_candidate: Option<u64>) -> Self {
        Self {
            http2_candidate,
            ..Self::new(fallback)
        }
    }

    pub(crate) fn new(fallback: Miss) -> Self {
        Self {
            http2_candidate: None,
            miss: OnceLock::new(),
            fallback,
            waiters: Mutex::new(Vec::new()),
        }
    }

    /// The kernel answered: the miss is known; runs the waiters (on the
    /// calling thread, the kernel view's).
    pub(crate) fn set(&self, miss: Miss) {
        let waiters = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            let _ = self.miss.set(miss);
            std::mem::take(&mut *waiters)
        };
        let miss = self.get();
        for waiter in waiters {
            waiter(miss);
        }
    }

    fn when_settled(&self, then: impl FnOnce(Miss) + Send + 'static) {
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            if self.miss.get().is_none() {
                waiters.push(Box::new(then));
                return;
            }
        }
        then(self.get());
    }

    fn get(&self) -> Miss {
        self.miss.get().copied().unwrap_or(self.fallback)
    }

    /// Whether the kernel has answered.
    pub(crate) fn is_settled(&self) -> bool {
        self.miss.get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_decided_miss_is_settled_and_answers_at_once() {
        let slot = MissSlot::Decided(Miss::new(MissReason::AllBusy));
        assert!(slot.is_settled());
        assert_eq!(slot.get().reason, MissReason::AllBusy);
        let (tx, rx) = mpsc::channel();
        slot.when_settled(move |m| tx.send(m.reason).expect("receiver"));
        assert_eq!(rx.try_recv(), Ok(MissReason::AllBusy));
        assert!(matches!(slot.settled(), MissSlot::Decided(_)));
    }

    #[test]
    fn a_pending_miss_answers_its_waiters_and_is_kept_by_value_once_answered() {
        let pending = Arc::new(PendingMiss::new(Miss::new(MissReason::AllBusy)));
        let slot = MissSlot::Pending(pending.clone());
        assert!(!slot.is_settled());
        assert_eq!(slot.get().reason, MissReason::AllBusy, "the fallback");
        // Not answered yet: a connection keeps the shared slot.
        assert!(matches!(slot.clone().settled(), MissSlot::Pending(_)));
        let (tx, rx) = mpsc::channel();
        slot.when_settled(move |m| tx.send(m.reason).expect("receiver"));
        assert!(rx.try_recv().is_err(), "waits for the kernel");

        pending.set(Miss::new(MissReason::ReleaseRace));
        assert_eq!(rx.try_recv(), Ok(MissReason::ReleaseRace));
        assert!(slot.is_settled());
        assert_eq!(slot.get().reason, MissReason::ReleaseRace);
        match slot.settled() {
            MissSlot::Decided(miss) => assert_eq!(miss.reason, MissReason::ReleaseRace),
            MissSlot::Pending(_) => panic!("answered: kept by value"),
        }
        drop(pending);
    }

    /// A miss that named as ended the connection that then served its own
    /// request as the next one it carried was hyper-util's release race,
    /// naming that connection alive (no limit behind it); one that served
    /// another request first was busy at the miss (`all_busy`, nothing
    /// ended); any other miss stays as it was.
    #[test]
    fn a_miss_naming_its_serving_connection_as_ended_was_the_release_race() {
        let previous = Previous {
            id: 7,
            idle: Duration::from_millis(1),
            request_count: 3,
            end: Some(ConnectionEnd::IdleLimit),
            kept_past_keep_alive: None,
            warn_keep_alive: false,
        };
        let miss = Miss::caused_by(MissReason::AllBusy, previous).limits_inferred();
        let served = miss.served_by(7, 4);
        assert_eq!(served.reason, MissReason::ReleaseRace);
        assert_eq!(
            served.previous,
            Some(Previous {
                end: None,
                ..previous
            })
        );
        assert_eq!(served.limits, None);
        let busy = miss.served_by(7, 5);
        assert_eq!(busy.reason, MissReason::AllBusy);
        assert_eq!(busy.previous, None, "no connection ended");
        assert_eq!(busy.limits, None);
        assert_eq!(miss.served_by(8, 4), miss, "served by another connection");
        let race = Miss::caused_by(
            MissReason::ReleaseRace,
            Previous {
                end: None,
                ..previous
            },
        );
        assert_eq!(race.served_by(7, 4), race);
    }
}
