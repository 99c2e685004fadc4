//! Setup spans held open after their connect ended (their end time already
//! fixed): until their trigger's fate is known ([`PendingSetup`]: did the
//! connect serve it?), and until their trigger records its miss reason
//! ([`SetupReason`]), which the setup span of the connect that miss
//! started carries too.
//!
//! A request span records its miss reason at its response, or later: once
//! the kernel has answered about the candidate connection, or once the
//! responses in flight on an HTTP/2 connection the server ended are counted
//! (a GOAWAY read again as `request_limit`). Read when the connect ended,
//! the setup span said what was known then (the fallback `all_busy`, the
//! first reading `closed_by_peer`), and a sampler keeping setup spans
//! without their requests (`KeepConnectionSetups`) showed that. So the setup
//! span of the trigger's first connect, once its trigger got a response,
//! is held open (its end time already fixed) until the request records its
//! reason, and carries that reason.

use std::mem;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use opentelemetry::trace::TraceContextExt;
use opentelemetry::{Context, KeyValue};

use crate::export::phases::SetupSpanEnd;
use crate::miss::MissReason;
use crate::pool::record::ConnectionRecord;
use crate::semconv;

/// A connection-setup span whose connect succeeded but whose triggering
/// request has not been served yet: whether it served its trigger is not
/// known, so the span stays open (its end time is already fixed).
#[derive(Debug)]
pub(crate) struct PendingSetup {
    pub(crate) record: Arc<ConnectionRecord>,
    pub(crate) cx: Context,
    pub(crate) end: SystemTime,
    /// Shared with the kernel's answer when a `tcp.connect` event waits
    /// for it ([`ConnectionPhases::Events`](crate::ConnectionPhases::Events)): the span ends when both are done.
    pub(crate) setup_end: Option<Arc<SetupSpanEnd>>,
    /// Its connect's miss is the one its trigger's span records (see
    /// [`SetupReason`]).
    pub(crate) trigger_miss: bool,
}

/// The setup spans a request holds open until its span records its miss
/// reason ([`record`](Self::record)); ended then with that reason, or with
/// their own when the request recorded none or is dropped first.
#[derive(Debug, Default)]
pub(crate) struct SetupReason {
    state: Mutex<Held>,
}

#[derive(Debug)]
enum Held {
    /// The request has not recorded its reason yet.
    Waiting(Vec<PendingSetup>),
    /// What it recorded (`None`: no reason of its own).
    Recorded(Option<MissReason>),
}

impl Default for Held {
    fn default() -> Self {
        Held::Waiting(Vec::new())
    }
}

impl SetupReason {
    /// Holds `setup` until the request records its reason; ends it at once
    /// if it has.
    pub(crate) fn hold(&self, setup: PendingSetup) {
        let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *held {
            Held::Waiting(setups) => setups.push(setup),
            Held::Recorded(reason) => {
                let reason = *reason;
                drop(held);
                end_setup(setup, reason);
            }
        }
    }

    /// The request's span recorded `reason` (`None`: none of its own):
    /// ends the setup spans held for it. Only the first call counts.
    pub(crate) fn record(&self, reason: Option<MissReason>) {
        let setups = {
            let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *held {
                Held::Waiting(setups) => {
                    let setups = mem::take(setups);
                    *held = Held::Recorded(reason);
                    setups
                }
                Held::Recorded(_) => return,
            }
        };
        for setup in setups {
            end_setup(setup, reason);
        }
    }
}

impl Drop for SetupReason {
    /// Never leaves a setup span open: a request gone before recording a
    /// reason (not expected: every path records one) ends them with their
    /// own.
    fn drop(&mut self) {
        let held = mem::take(self.state.get_mut().unwrap_or_else(|e| e.into_inner()));
        if let Held::Waiting(setups) = held {
            for setup in setups {
                end_setup(setup, None);
            }
        }
    }
}

/// Ends `setup`'s span with `reason`, or (`None`) its own connect's miss
/// reason as known now.
pub(crate) fn end_setup(setup: PendingSetup, reason: Option<MissReason>) {
    let span = setup.cx.span();
    let reason = reason.or_else(|| {
        let miss = setup.record.miss.as_ref()?.get();
        (!miss.untracked).then_some(miss.reason)
    });
    if let Some(reason) = reason {
        span.set_attribute(KeyValue::new(
            semconv::HTTP_CONNECTION_MISS_REASON,
            reason.as_str(),
        ));
    }
    match &setup.setup_end {
        Some(setup_end) => setup_end.arrive(),
        None => span.end_with_timestamp(setup.end),
    }
}
