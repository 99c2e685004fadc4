//! A miss whose reason waits for the kernel's view of its candidate
//! ([`KernelAsk`]): the kernel's answer decides it, after up to four
//! waits, each of which asks the kernel again (off the request path: only
//! the miss's span waits, see [`PendingMiss`]):
//!
//! 1. **for a pool that keeps none** ([`KernelAsk::wait_for_pool_off`]):
//!    the candidate was closed at its release and the client's other
//!    connections released just before are on their way to the same close
//!    (row 3b of the decision table, docs/REFERENCE.md section 14);
//! 2. **for the candidate's fate** ([`KernelAsk::look_again`]): the kernel
//!    cannot tell yet (see [`look_again_at`]);
//! 3. **for a response in flight** ([`KernelAsk::wait_for_response`]) that
//!    may explain the close the kernel shows (see
//!    [`response_may_explain_end`]);
//! 4. **for the candidate's next request** ([`KernelAsk::may_wait_for_rider`]):
//!    alive, released just before the miss, with other requests in flight,
//!    it was held by one of them or on its way back to the pool (row 10e's
//!    release race, see [`rider_since`]).
//!
//! Then [`KernelAsk::decide`] settles it (see [`decide_from_kernel`]), or,
//! when the candidate was alive and another request in flight may hold it,
//! asks about the connection the miss would have had instead
//! ([`KernelAsk::ask_next`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::inner::{INFER_FOLLOW_UPS, Inner};
use crate::kernel::KernelLookup;
use crate::miss::{ConnectionEnd, MissReason};
use crate::pool::host::HostKey;
use crate::pool::inferred::{CLOSED_AT_RELEASE, LimitSource, PoolClose};
use crate::pool::kernel_decision::{
    KernelQuestion, RESPONSE_IN_FLIGHT_WAIT, Rider, decide_from_kernel, look_again_at,
    may_wait_for_pool_off, response_may_explain_end, rider_since,
};
use crate::pool::model::PoolOff;
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::{Miss, PendingMiss, Previous};

/// How often a miss whose candidate its pool closed at release asks again
/// while the client's other connections released just before are not
/// seen closed yet (see [`PoolHistory::pool_off_evidence`](crate::pool::model::PoolHistory::pool_off_evidence)).
const POOL_OFF_LOOK_EVERY: Duration = Duration::from_millis(5);

/// How often a miss waiting for the request that takes its candidate
/// next looks at the candidate's request count ([`KernelAsk::may_wait_for_rider`]).
const RIDER_LOOK_EVERY: Duration = Duration::from_millis(10);

/// Wait 4's state: the miss decided from the kernel's answer as of
/// `answered`, kept while the miss waits for its candidate's next request
/// until `until`.
struct RiderWait {
    miss: Miss,
    answered: Instant,
    until: Instant,
}

/// A miss whose reason waits for the kernel's view of its candidate.
pub(super) struct KernelAsk {
    host: HostKey,
    question: KernelQuestion,
    /// The second look after [`RESPONSE_IN_FLIGHT_WAIT`] was taken.
    waited_for_response: bool,
    /// It looked again at a candidate the kernel showed established, with
    /// other requests in flight ([`may_wait_for_pool_off`]): unless the
    /// pool is shown to keep none by the end, the miss is `alive`.
    waited_for_pool_off: bool,
    /// The kernel's first answer and when it came, kept while the miss
    /// waits for the client's pool to show it keeps none
    /// ([`PoolOff::Pending`]).
    first_answer: Option<(KernelLookup, Instant)>,
    /// When the lookup being answered was asked for (the miss, or when a
    /// look again was due): a close the answer shows came no later than
    /// that, as far as a late answer (a starved kernel thread) can date it
    /// ([`Inner::note_close_at_release`]).
    asked_at: Instant,
    /// That wait is over (it is taken once, for at most
    /// [`CLOSED_AT_RELEASE`] after the miss).
    pool_off_wait_over: bool,
    /// Wait 4 ([`KernelAsk::may_wait_for_rider`]) is on: the miss decided
    /// from the kernel's answer, when it came, and until when it waits.
    rider_wait: Option<RiderWait>,
    slot: Arc<PendingMiss>,
}

impl Drop for KernelAsk {
    /// A lookup dropped unanswered (the kernel view's thread ended with it
    /// still queued): the miss settles as if the kernel were silent.
    fn drop(&mut self) {
        if !self.slot.is_settled() {
            self.slot.set(self.question.alive);
        }
    }
}

/// Each wait takes the kernel's answer (`None`: it asked again, the miss
/// settles at that answer, or it settled the miss) or hands the ask back for
/// the next wait, or the decision.
impl KernelAsk {
    /// Asks the kernel about `question`'s candidate for `inner`'s miss to
    /// `host`; the miss settles in `slot` when it answers (or with
    /// `question.alive` when the kernel view ends unanswered).
    pub(super) fn send(
        inner: &Arc<Inner>,
        host: HostKey,
        question: KernelQuestion,
        slot: Arc<PendingMiss>,
    ) {
        let (local, remote) = (question.local, question.remote);
        let asked_at = question.classified_at;
        let ask = KernelAsk {
            host,
            question,
            waited_for_response: false,
            waited_for_pool_off: false,
            first_answer: None,
            asked_at,
            pool_off_wait_over: false,
            rider_wait: None,
            slot,
        };
        let weak = Arc::downgrade(inner);
        inner.kernel.lookup_then(local, remote, move |lookup| {
            settle_miss(&weak, ask, &lookup)
        });
    }

    /// Asks the kernel again at `due` (not before); its answer settles the
    /// miss as the first did.
    fn ask_again_at(mut self, inner: &Arc<Inner>, due: Instant) -> Option<KernelAsk> {
        self.asked_at = due;
        let (local, remote) = (self.question.local, self.question.remote);
        let weak = Arc::downgrade(inner);
        inner.kernel.lookup_at(local, remote, due, move |lookup| {
            settle_miss(&weak, self, &lookup);
        });
        None
    }

    /// The miss may wait for the client's pool to show it keeps none: not
    /// waited yet, and the candidate was closed at its release, or the
    /// kernel may show it alive while the pool is closing it ([`may_wait_for_pool_off`]).
    fn may_wait_for_pool_off(&self) -> bool {
        let candidate = &self.question.candidate;
        !self.pool_off_wait_over
            && (candidate.is_closed_at_release()
                || may_wait_for_pool_off(candidate, &self.question.alive))
    }

    /// Notes what `lookup` (as of `now`) shows of the candidate's close at
    /// release, and whether the client's pool is now known to keep none
    /// (row 3b): its idle limit inferred as 0 before, or every connection
    /// it released before this miss closed at its release (two or more).
    fn shows_pool_off(&self, inner: &Inner, lookup: &KernelLookup, now: Instant) -> bool {
        let candidate = &self.question.candidate;
        inner.note_close_at_release(candidate, lookup, now, self.asked_at.min(now));
        if !candidate.http2()
            && !candidate.client.max_idle_known
            && candidate.client.inferred.keeps_none()
        {
            return true;
        }
        if self.may_wait_for_pool_off()
            && inner
                .pools
                .pool_off_evidence(
                    &self.host,
                    &candidate.client,
                    Some((now, self.question.classified_at)),
                )
                .0
                == PoolOff::Shown
        {
            // The ones released since, still on their way to the same close
            // (this answer can come late: a starved kernel thread, or a
            // wave that ended meanwhile), neither confirm nor refute it.
            candidate.client.inferred.observe(PoolClose::AtRelease {
                idle_others: Some(0),
            });
            return candidate.client.inferred.keeps_none();
        }
        false
    }

    /// Wait 1: closed at its release (or all busy, its pool's limits
    /// unknown), and the client's other connections released just before
    /// are on their way to the same close (a pool that keeps none closes
    /// each on hyper-util's own task): asks again every
    /// [`POOL_OFF_LOOK_EVERY`], checking them too, until they are (row 3b)
    /// or their time is up (at most [`CLOSED_AT_RELEASE`] after the miss).
    /// If they are not, the answer the miss first had decides it, as it
    /// would have without the wait.
    fn wait_for_pool_off(
        mut self,
        inner: &Arc<Inner>,
        lookup: &KernelLookup,
        now: Instant,
    ) -> Option<KernelAsk> {
        let candidate = &self.question.candidate;
        if self.may_wait_for_pool_off()
            && let (PoolOff::Pending(until), pending) = inner.pools.pool_off_evidence(
                &self.host,
                &candidate.client,
                Some((now, self.question.classified_at)),
            )
        {
            let until = until.min(self.question.classified_at + CLOSED_AT_RELEASE);
            if now < until {
                for other in pending {
                    if other.id() != candidate.id() {
                        inner.check_with_kernel(other);
                    }
                }
                self.first_answer
                    .get_or_insert_with(|| (lookup.clone(), now));
                let due = (now + POOL_OFF_LOOK_EVERY).min(until);
                return self.ask_again_at(inner, due);
            }
        }
        match self.first_answer.take() {
            Some((first, answered)) => {
                self.pool_off_wait_over = true;
                settle_miss_at(&Arc::downgrade(inner), self, &first, answered);
                None
            }
            None => Some(self),
        }
    }

    /// Wait 2: the candidate's fate was still being decided when the kernel
    /// answered (see [`look_again_at`]): asks again when it should show.
    fn look_again(
        mut self,
        inner: &Arc<Inner>,
        lookup: &KernelLookup,
        now: Instant,
    ) -> Option<KernelAsk> {
        let question = &self.question;
        let Some(due) = look_again_at(
            &question.candidate,
            lookup,
            now,
            &question.alive,
            question.requests_seen,
            question.classified_at,
        ) else {
            return Some(self);
        };
        if !question.candidate.client.max_idle_known {
            // Their closes, answered first, may lower the idle count at
            // the candidate's release.
            inner.recheck_believed_idle(&question.candidate);
        }
        if matches!(lookup, KernelLookup::Found(facts) if facts.state == crate::TcpState::Established)
            && may_wait_for_pool_off(&question.candidate, &question.alive)
        {
            self.waited_for_pool_off = true;
        }
        self.ask_again_at(inner, due)
    }

    /// Wait 3 (once): a response in flight on the candidate may explain
    /// the close the kernel shows (see [`response_may_explain_end`]):
    /// asks again after [`RESPONSE_IN_FLIGHT_WAIT`]. The close is applied
    /// now (the history forgets closed connections; a response still finds
    /// it among the registry's recently closed, and its `Connection: close`
    /// replaces an inferred end), but for a close of ours under limits this
    /// crate cannot read: that one infers a limit, which a close after
    /// `Connection: close` must not.
    fn wait_for_response(
        mut self,
        inner: &Arc<Inner>,
        lookup: &KernelLookup,
        now: Instant,
    ) -> Option<KernelAsk> {
        let question = &self.question;
        if self.waited_for_response
            || !response_may_explain_end(
                &question.candidate,
                lookup,
                question.requests_seen,
                question.others_in_flight,
            )
        {
            return Some(self);
        }
        let ours = matches!(
            lookup,
            KernelLookup::Found(facts) if facts.state.closed_by_us()
        );
        if !ours || question.candidate.client.limits_known() {
            inner.apply_kernel_view(&question.candidate, lookup, self.asked_at);
        }
        self.waited_for_response = true;
        self.ask_again_at(inner, now + RESPONSE_IN_FLIGHT_WAIT)
    }

    /// The candidate was alive at the miss, held by another request in
    /// flight (row 10e): the miss would have had `next`
    /// ([`PoolHistory::next_candidate`](crate::pool::model::PoolHistory::next_candidate)),
    /// which the kernel is asked about now, its answer settling the miss as
    /// the first did (with one request fewer that may hold it). A server's
    /// idle close of `next` while the candidate served is then named
    /// (`closed_by_peer`), not `all_busy`.
    fn ask_next(mut self, inner: &Arc<Inner>, next: Arc<ConnectionRecord>) {
        let (Some(local), Some(remote)) = (next.setup.local_addr, next.setup.peer_addr) else {
            self.slot.set(self.question.alive);
            return;
        };
        let question = &self.question;
        self.question = KernelQuestion {
            local,
            remote,
            requests_seen: next.requests.load(Ordering::Relaxed),
            released: next.last_released(),
            candidate: next,
            alive: question.alive,
            classified_at: question.classified_at,
            others_in_flight: question.others_in_flight,
            may_hold: question.may_hold.saturating_sub(1),
        };
        self.waited_for_response = false;
        self.waited_for_pool_off = false;
        self.first_answer = None;
        self.pool_off_wait_over = false;
        self.asked_at = Instant::now();
        let weak = Arc::downgrade(inner);
        inner.kernel.lookup_then(local, remote, move |lookup| {
            settle_miss(&weak, self, &lookup)
        });
    }

    /// Settles the miss from `lookup` (as of `now`): `alive` after a wait
    /// for a pool that keeps none that did not show it (`pool_off` false),
    /// else [`decide_from_kernel`]; then applies the kernel's view (when
    /// the handle is still there, `inner`) and names what the decision
    /// leaves out (a connection its announced close ended, the client's
    /// other idle connections for an inferred idle limit).
    fn decide(
        mut self,
        inner: Option<&Arc<Inner>>,
        lookup: &KernelLookup,
        now: Instant,
        pool_off: bool,
    ) {
        let candidate = &self.question.candidate;
        let miss = if self.waited_for_pool_off && !pool_off {
            self.question.alive
        } else {
            decide_from_kernel(
                candidate,
                lookup,
                now,
                self.question.alive,
                self.question.requests_seen,
                self.question.classified_at,
            )
        };
        if let Some(inner) = inner {
            inner.apply_kernel_view(candidate, lookup, self.asked_at);
            if self.may_wait_for_rider(&miss, lookup) {
                let until = self.question.classified_at + RESPONSE_IN_FLIGHT_WAIT;
                if now < until {
                    self.rider_wait = Some(RiderWait {
                        miss,
                        answered: now,
                        until,
                    });
                    let due = (now + RIDER_LOOK_EVERY).min(until);
                    self.ask_again_at(inner, due);
                    return;
                }
            }
        }
        self.settle(inner, miss, now);
    }

    /// Wait 4: a candidate the kernel showed alive, released just before
    /// the miss, with other requests in flight (row 10e's release race):
    /// whether one of them held it shows when the next request on it is
    /// counted ([`rider_since`]). The miss waits for that (looking every
    /// [`RIDER_LOOK_EVERY`], up to [`RESPONSE_IN_FLIGHT_WAIT`] after it),
    /// then settles as decided from the kernel's answer it kept.
    fn may_wait_for_rider(&self, miss: &Miss, lookup: &KernelLookup) -> bool {
        let question = &self.question;
        self.rider_wait.is_none()
            && *miss == question.alive
            && miss.reason == MissReason::AllBusy
            && miss.previous.is_none()
            && matches!(lookup, KernelLookup::Found(facts) if facts.state == crate::TcpState::Established)
            && rider_since(
                &question.candidate,
                question.requests_seen,
                question.released,
                question.classified_at,
            ) == Rider::NoneYet
    }

    /// A look during wait 4 (as of `now`): waits on while no request was
    /// counted on the candidate and time is left (and the handle is still
    /// there), else settles the miss as decided from the answer kept.
    fn look_for_rider(mut self, weak: &Weak<Inner>, now: Instant) {
        let question = &self.question;
        let rider = rider_since(
            &question.candidate,
            question.requests_seen,
            question.released,
            question.classified_at,
        );
        let inner = weak.upgrade();
        if let (Some(inner), Some(wait)) = (&inner, &self.rider_wait)
            && rider == Rider::NoneYet
            && now < wait.until
        {
            let due = (now + RIDER_LOOK_EVERY).min(wait.until);
            self.ask_again_at(inner, due);
            return;
        }
        if let Some(RiderWait { miss, answered, .. }) = self.rider_wait.take() {
            self.settle(inner.as_ref(), miss, answered);
        }
    }

    /// Settles the miss as `miss`, decided from the kernel's answer as of
    /// `now`: a candidate taken first by a request that started after the
    /// miss was on its way back to the pool (`release_race`, naming it
    /// alive); a busy candidate may send the miss to the next one
    /// ([`KernelAsk::ask_next`]); and names what the decision leaves out.
    fn settle(self, inner: Option<&Arc<Inner>>, mut miss: Miss, now: Instant) {
        let candidate = &self.question.candidate;
        if miss == self.question.alive
            && miss.reason == MissReason::AllBusy
            && miss.previous.is_none()
            && let Some(released) = self.question.released
            && rider_since(
                candidate,
                self.question.requests_seen,
                self.question.released,
                self.question.classified_at,
            ) == Rider::AfterMiss
        {
            miss = Miss::caused_by(
                MissReason::ReleaseRace,
                Previous {
                    id: candidate.id(),
                    // Up to `now`: trimmed to the miss below.
                    idle: now.saturating_duration_since(released),
                    request_count: self.question.requests_seen,
                    end: None,
                    kept_past_keep_alive: None,
                    warn_keep_alive: false,
                },
            );
        }
        if let Some(inner) = inner {
            if miss == self.question.alive
                && miss.reason == MissReason::AllBusy
                && miss.previous.is_none()
                && self.question.may_hold > 0
                && !candidate.http2()
                && let Some(next) = inner.pools.next_candidate(
                    &self.host,
                    candidate,
                    self.question.classified_at,
                    now,
                )
            {
                self.ask_next(inner, next);
                return;
            }
            if miss.reason == MissReason::AllBusy
                && miss.previous.is_none()
                && let Some(ended) = inner.pools.name_known_loss(
                    &self.host,
                    candidate.client.id,
                    candidate.id(),
                    self.question.classified_at,
                    now,
                )
            {
                // Busy, but a connection ended by its announced close is why
                // the pool had none free (row 4's exception).
                miss = ended;
            }
            if miss.limits == Some(LimitSource::Inferred)
                && miss.previous.and_then(|p| p.end) == Some(ConnectionEnd::IdleLimit)
            {
                // The idle count at its release may include connections
                // already closed over the limit: the client's other idle
                // ones give tighter bounds.
                for other in
                    inner
                        .pools
                        .idle_of_client(&self.host, candidate.client.id, INFER_FOLLOW_UPS)
                {
                    if other.id() != candidate.id() {
                        inner.check_with_kernel(other);
                    }
                }
            }
        }
        if let Some(previous) = &mut miss.previous {
            // Its idle time up to the miss, not up to the answer.
            previous.idle = previous
                .idle
                .saturating_sub(now.saturating_duration_since(self.question.classified_at));
        }
        self.slot.set(miss);
    }
}

/// The kernel answered `lookup` about `ask`'s candidate (on the kernel
/// view's thread): settles the miss, or asks again (the waits in this
/// module's docs).
fn settle_miss(weak: &Weak<Inner>, ask: KernelAsk, lookup: &KernelLookup) {
    settle_miss_at(weak, ask, lookup, Instant::now());
}

/// [`settle_miss`] with the kernel's answer `lookup` as of `now`. A handle
/// dropped meanwhile (`weak` gone) decides from the answer alone.
fn settle_miss_at(weak: &Weak<Inner>, ask: KernelAsk, lookup: &KernelLookup, now: Instant) {
    if ask.rider_wait.is_some() {
        ask.look_for_rider(weak, now);
        return;
    }
    let Some(inner) = weak.upgrade() else {
        ask.decide(None, lookup, now, false);
        return;
    };
    // Its own close at release, before the rest: once the pool's closes
    // show it keeps none, the miss is decided at once (row 3b).
    let pool_off = ask.shows_pool_off(&inner, lookup, now);
    let ask = if pool_off {
        ask
    } else {
        let Some(ask) = ask.wait_for_pool_off(&inner, lookup, now) else {
            return;
        };
        let Some(ask) = ask.look_again(&inner, lookup, now) else {
            return;
        };
        let Some(ask) = ask.wait_for_response(&inner, lookup, now) else {
            return;
        };
        ask
    };
    ask.decide(Some(&inner), lookup, now, pool_off);
}
