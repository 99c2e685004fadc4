//! The state of one request in flight: what the connector layer needs to know
//! about the request that triggered a connect, and how that connect's setup
//! span is finished once the request's fate is known.

use std::cell::RefCell;
use std::mem;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::trace::{Status, TraceContextExt};

use crate::kernel::{KernelLookup, KernelView};
use crate::miss::MissReason;
use crate::pool::end_report::ReportedEnd;
use crate::pool::host::HostKey;
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::MissSlot;
use crate::request::pending_setup::{PendingSetup, SetupReason, end_setup};
use crate::semconv;

/// One request going through the middleware.
#[derive(Debug)]
pub(crate) struct RequestState {
    pub(crate) id: u64,
    pub(crate) started: Instant,
    /// The URL's scheme, host (`server.address`) and port: the pool key.
    pub(crate) host: HostKey,
    trigger: Mutex<TriggerState>,
    /// Why the first connect this request triggered was needed.
    miss: Mutex<Option<MissSlot>>,
    /// Why the latest connect after the first was needed (see
    /// [`later_miss`](Self::later_miss)).
    later_miss: Mutex<Option<MissSlot>>,
    /// Connects this request triggered (pool checkouts that found no
    /// usable connection).
    connects: AtomicU32,
    /// The fan-out batch the request was started in, if any.
    pub(crate) batch: Option<Arc<crate::request::fanout::BatchStats>>,
    /// What the request's own `Connection` header says: `Some(true)` it
    /// lists `close` (it asks for its connection to end with its
    /// response), `Some(false)` it does not, `None` the request has none
    /// (reqwest then adds the client's default one, after the middleware:
    /// see [`asked_close`](Self::asked_close)).
    connection_close_header: Option<bool>,
    /// The setup of the last connect this request triggered that failed.
    failed_connect: Mutex<Option<Arc<crate::ConnectionSetup>>>,
    /// Times the rest of the stack (reqwest, hyper-util) was polled for
    /// this request: see [`given_up_unwritten`](Self::given_up_unwritten).
    polls: AtomicU32,
    /// The current-thread tokio runtime the first poll ran on (none on a
    /// multi-thread runtime or outside tokio).
    first_poll_runtime: OnceLock<tokio::runtime::Id>,
    /// The setup span of the connect its miss started, held open until its
    /// span records that miss's reason.
    setup_reason: Arc<SetupReason>,
}

#[derive(Debug, Default)]
struct TriggerState {
    finished: Option<Fate>,
    pending: Vec<PendingSetup>,
}

/// How the request ended, as far as connects it triggered are concerned.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fate {
    /// A response arrived over this connection.
    ServedBy { connection_id: u64 },
    /// The request failed or was cancelled before any response.
    NoResponse,
}

impl RequestState {
    /// A request `id` to `host`; `connection_close_header`: what its own
    /// `Connection` header says of closing (`None`: it has none).
    pub(crate) fn new(id: u64, host: HostKey, connection_close_header: Option<bool>) -> Self {
        Self {
            id,
            started: Instant::now(),
            host,
            trigger: Mutex::new(TriggerState::default()),
            miss: Mutex::new(None),
            later_miss: Mutex::new(None),
            connects: AtomicU32::new(0),
            batch: crate::request::fanout::current(),
            connection_close_header,
            failed_connect: Mutex::new(None),
            polls: AtomicU32::new(0),
            first_poll_runtime: OnceLock::new(),
            setup_reason: Arc::default(),
        }
    }

    /// Whether the request, sent by `client`, asked for its connection to
    /// end with its response (`Connection: close`, RFC 9112 section 9.6):
    /// its own `Connection` header says, else the client's default headers
    /// (reqwest fills in the headers a request lacks from
    /// `ClientBuilder::default_headers` after the middleware saw it; see
    /// [`ClientState::default_connection_close`](crate::pool::client::ClientState::default_connection_close)).
    pub(crate) fn asked_close(&self, client: &crate::pool::client::ClientState) -> bool {
        self.connection_close_header
            .unwrap_or(client.default_connection_close)
    }

    /// The stack below the middleware is polled once more for this request.
    pub(crate) fn note_poll(&self) {
        if self.polls.fetch_add(1, Ordering::Relaxed) == 0
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
            && runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        {
            let _ = self.first_poll_runtime.set(runtime.id());
        }
    }

    /// The request, unfinished, was polled only once, on the current-thread
    /// runtime `connection_runtime` (the one whose task serves the
    /// connection it was handed): a future dropped then (`now_or_never`,
    /// a biased `select!` whose other branch was ready in the same poll;
    /// not `tokio::time::timeout(Duration::ZERO, ..)`, whose timer fires on
    /// a later turn, after hyper wrote the request) was given up before hyper could
    /// write it. hyper writes on the connection's own task (HTTP/1.1
    /// dispatcher, HTTP/2 `ClientTask`), which the request's first poll
    /// only wakes; on a current-thread runtime that task runs on the same
    /// thread, once the request's task has yielded, and by then the
    /// request's callback is cancelled, so hyper drops the request
    /// unwritten (hyper 1.x `proto/h1/dispatch.rs` `poll_msg`: "request
    /// canceled"; `proto/h2/client.rs`: "request callback is canceled").
    /// On a multi-thread runtime another thread may run that task at once
    /// (seen: a `now_or_never` in `block_on` returned nginx's response), so
    /// nothing is told there.
    pub(crate) fn given_up_unwritten(
        &self,
        connection_runtime: Option<tokio::runtime::Id>,
    ) -> bool {
        self.polls.load(Ordering::Relaxed) == 1
            && connection_runtime.is_some()
            && self.first_poll_runtime.get().copied() == connection_runtime
    }

    /// A connect this request triggered failed (or was cancelled) with
    /// `setup`.
    pub(crate) fn connect_failed(&self, setup: Arc<crate::ConnectionSetup>) {
        *self
            .failed_connect
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(setup);
    }

    /// The setup of the last connect this request triggered that failed.
    pub(crate) fn failed_connect(&self) -> Option<Arc<crate::ConnectionSetup>> {
        self.failed_connect
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records why a connect this request triggered was needed (first one
    /// wins: the miss its span records). Returns whether it was the first.
    pub(crate) fn note_miss(&self, slot: MissSlot) -> bool {
        self.connects.fetch_add(1, Ordering::Relaxed);
        let mut m = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let first = m.is_none();
        if first {
            *m = Some(slot);
        } else {
            drop(m);
            *self.later_miss.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
        }
        first
    }

    /// Why the latest connect after this request's first was needed: a
    /// second connect comes from a resend, hyper-util's own (a request the
    /// server refused unprocessed as it ended its connection) or a
    /// middleware's after this crate's, and this miss names the connection
    /// that ended when the server ended it.
    pub(crate) fn later_miss(&self) -> Option<MissSlot> {
        self.later_miss
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The miss reason this request's span recorded (`None`: none, an idle
    /// hit or an untracked miss; the setup spans then carry their own):
    /// the setup span of the connect its miss started carries it too,
    /// ended now if it was held for it ([`SetupReason`]).
    pub(crate) fn miss_recorded(&self, reason: Option<MissReason>) {
        self.setup_reason.record(reason);
    }

    /// Where [`RecordedWhenDropped`](crate::request::attribution) hands the
    /// reason recorded after the request's response.
    pub(crate) fn setup_reason(&self) -> Arc<SetupReason> {
        Arc::clone(&self.setup_reason)
    }

    /// Connects this request triggered so far: one per pool checkout that
    /// found no usable connection.
    pub(crate) fn connects(&self) -> u32 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Why this request's pool checkout failed, if it triggered a connect.
    pub(crate) fn miss(&self) -> Option<MissSlot> {
        self.miss.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn trigger(&self) -> MutexGuard<'_, TriggerState> {
        self.trigger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connect this request triggered is ready: finish its span now if the
    /// request's fate is known, else when it is. Returns the connection
    /// when it went into the pool unused (see [`finish`](Self::finish)).
    pub(crate) fn connect_ready(
        &self,
        pending: PendingSetup,
        kernel: &KernelView,
    ) -> Option<Arc<ConnectionRecord>> {
        let mut t = self.trigger();
        match t.finished {
            Some(fate) => {
                drop(t);
                finish_setup(
                    pending,
                    fate,
                    self.connects() > 1,
                    &self.setup_reason,
                    Some(kernel),
                )
            }
            None => {
                t.pending.push(pending);
                None
            }
        }
    }

    /// The request's fate is known: finish every setup span it triggered.
    /// Only the first call counts. Returns the HTTP/1.1 connections among
    /// them that the request did not use: hyper-util puts such a
    /// connection into its pool unused as its connect completes (where
    /// its idle limit may close it at once), so the caller releases it to
    /// the pool model.
    pub(crate) fn finish(
        &self,
        fate: Fate,
        kernel: Option<&KernelView>,
    ) -> Vec<Arc<ConnectionRecord>> {
        let pending = {
            let mut t = self.trigger();
            if t.finished.is_some() {
                return Vec::new();
            }
            t.finished = Some(fate);
            mem::take(&mut t.pending)
        };
        // More than one connect: a middleware after ours sent requests we
        // did not see, on connections other than the one that answered.
        let unseen = self.connects() > 1;
        pending
            .into_iter()
            .filter_map(|p| finish_setup(p, fate, unseen, &self.setup_reason, kernel))
            .collect()
    }
}

impl Drop for RequestState {
    fn drop(&mut self) {
        // Never leave a setup span open: a request dropped without an outcome
        // (not expected: the middleware's guard finishes it) ends them here.
        let pending = mem::take(&mut self.trigger().pending);
        for p in pending {
            finish_setup(p, Fate::NoResponse, false, &self.setup_reason, None);
        }
    }
}

/// Sets the trigger-related attributes on a successful setup span and ends
/// it: with the miss reason its trigger's span records when its connect's
/// miss is that one (held in `reason` until then; a trigger that failed
/// before a response records it too), else with its own miss's reason. Returns the connection when it
/// is HTTP/1.1 and its trigger was served by another one: it went into the
/// pool unused. `unseen`: the trigger opened more than one connection, so
/// one it was not answered on may have carried a request sent by a
/// middleware after ours.
///
/// A connection whose trigger another connection served, and that has
/// carried no request yet, is kept or closed unused by its fate in
/// hyper-util's pool (hyper-util 0.1.21 `Pool::put`). HTTP/2: kept when
/// the pool held no HTTP/2 connection to the origin as it was put there
/// (it then serves later requests), else dropped at once ("existing idle
/// HTTP/2 connection"): `coalesced`. HTTP/1.1: handed to a waiting
/// checkout or kept idle, unless the host's idle list already holds
/// `pool_max_idle_per_host` connections ("max idle per host ... dropping
/// connection"), or the checkout it was handed to had been served
/// already: `closed_unused`. With the kernel view, its socket is looked at
/// [`UNUSED_LOOKS`] later (see [`UnusedLook::answer`]): closed by our side
/// (or, over TLS, gone) with still no request on it is closed unused; a
/// request on it, the server's close, or still open at the last look,
/// `pooled`. Without it, no request yet is taken for closed over HTTP/2
/// and kept over HTTP/1.1.
fn finish_setup(
    p: PendingSetup,
    fate: Fate,
    unseen: bool,
    reason: &Arc<SetupReason>,
    kernel: Option<&KernelView>,
) -> Option<Arc<ConnectionRecord>> {
    let span = p.cx.span();
    let mut pooled_unused = None;
    match fate {
        Fate::ServedBy { connection_id, .. } if unseen && connection_id != p.record.id() => {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_SETUP_OUTCOME,
                semconv::SETUP_OUTCOME_UNSEEN,
            ));
        }
        Fate::ServedBy { connection_id, .. } if connection_id == p.record.id() => {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_USED_BY_TRIGGER,
                true,
            ));
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_SETUP_OUTCOME,
                semconv::SETUP_OUTCOME_USED,
            ));
        }
        Fate::ServedBy { .. } => {
            span.set_attribute(KeyValue::new(
                semconv::HTTP_CONNECTION_USED_BY_TRIGGER,
                false,
            ));
            if !p.record.http2() {
                pooled_unused = Some(Arc::clone(&p.record));
            }
            if p.record.requests.load(Ordering::Relaxed) == 0 {
                if let Some(((local, remote), kernel)) =
                    p.record.pair().zip(kernel.filter(|k| k.is_available()))
                {
                    let look = Arc::new(UnusedLook {
                        pending: Mutex::new(Some(p)),
                        reason: Arc::clone(reason),
                        _pending_end: crate::export::pending::PendingEnd::new(),
                    });
                    let now = Instant::now();
                    for (i, after) in UNUSED_LOOKS.iter().enumerate() {
                        let look = Arc::clone(&look);
                        let last = i + 1 == UNUSED_LOOKS.len();
                        kernel.lookup_at(local, remote, now + *after, move |lookup| {
                            look.answer(&lookup, last);
                        });
                    }
                    return pooled_unused;
                }
                // Without the kernel: an HTTP/2 connection that carried no
                // request is taken for closed (see above); an HTTP/1.1 one
                // for kept.
                let http2 = p.record.http2();
                label_unused(&p, http2);
            } else {
                span.set_attribute(KeyValue::new(
                    semconv::HTTP_CONNECTION_SETUP_OUTCOME,
                    semconv::SETUP_OUTCOME_POOLED,
                ));
            }
        }
        Fate::NoResponse => {}
    }
    end_with_trigger_reason(p, reason);
    pooled_unused
}

/// When, after its trigger was served elsewhere, an unused connection's
/// socket is looked at (see [`finish_setup`]): hyper-util drops a
/// connection its pool did not keep as its background connect returns, on
/// its own task, which a loaded runtime runs tens to hundreds of
/// milliseconds later. The first look that shows it closed decides; one
/// still open at the last look was kept (`pooled`): its span ends then.
pub(crate) const UNUSED_LOOKS: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(100),
    std::time::Duration::from_millis(250),
    std::time::Duration::from_millis(500),
];

/// A setup span whose connection its trigger did not use, waiting for
/// the kernel's looks ([`UNUSED_LOOKS`]) to tell whether the pool kept it.
struct UnusedLook {
    /// Taken by the look that decides.
    pending: Mutex<Option<PendingSetup>>,
    reason: Arc<SetupReason>,
    /// Keeps a flush waiting until the span has ended
    /// ([`wait_for_pending_spans`](crate::wait_for_pending_spans)).
    _pending_end: crate::export::pending::PendingEnd,
}

impl UnusedLook {
    /// One look's answer: a socket closed by our side (or, over TLS, gone
    /// with the kernel's report of its end naming our side, or no report
    /// by the `last` look) while it still carried no request is closed
    /// unused; gone over plain TCP, or over TLS with a report naming the
    /// server (the server's close: the pool had kept it), a request on it,
    /// or the `last` look, decides kept; else the next look decides.
    fn answer(&self, lookup: &KernelLookup, last: bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = pending.as_ref() else {
            return;
        };
        let unused = p.record.requests.load(Ordering::Relaxed) == 0;
        // Over TLS a server's close_notify answering ours resets our
        // socket: gone may be ours, and the kernel's report of the socket's
        // end tells (a tester's TLS server idle-closing spares after 300 ms
        // read `closed_unused`); until it came, the next look decides, the
        // last one as ours.
        let tls_gone = match lookup {
            KernelLookup::NotFound if p.record.setup.tls.is_some() => {
                Some(crate::pool::end_report::reported_end(&p.record))
            }
            _ => None,
        };
        let closed = match lookup {
            // Over plain TCP our close leaves `TIME_WAIT` (60 s): gone is
            // the server's close of a connection the pool kept (a tester's
            // server idle-closing spares 100 ms after accept read
            // `closed_unused`).
            KernelLookup::NotFound => match tls_gone {
                Some(Some(ReportedEnd::Ours { .. })) => true,
                Some(None) => last,
                _ => false,
            },
            KernelLookup::Found(facts) => facts.state.closed_by_us(),
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        };
        // The server closed it first: kept by the pool until then.
        let servers = match lookup {
            KernelLookup::NotFound => match tls_gone {
                None => true,
                Some(reported) => reported == Some(ReportedEnd::Server),
            },
            KernelLookup::Found(facts) => facts.state.closed_by_peer(),
            KernelLookup::Unavailable | KernelLookup::TimedOut => false,
        };
        if unused && !closed && !servers && !last {
            return;
        }
        let Some(p) = pending.take() else {
            return;
        };
        drop(pending);
        label_unused(&p, unused && closed);
        end_with_trigger_reason(p, &self.reason);
    }
}

/// Labels `p`, a connection its trigger did not use and that carried no
/// request: closed unused by hyper-util's pool (`closed`): `coalesced` for
/// HTTP/2 (with its event and status `Ok`), `closed_unused` for HTTP/1.1;
/// else `pooled`.
fn label_unused(p: &PendingSetup, closed: bool) {
    let span = p.cx.span();
    let outcome = match (closed, p.record.http2()) {
        (false, _) => semconv::SETUP_OUTCOME_POOLED,
        (true, false) => semconv::SETUP_OUTCOME_CLOSED_UNUSED,
        (true, true) => {
            span.add_event_with_timestamp(
                semconv::EVENT_CONNECTION_COALESCED,
                p.end,
                vec![KeyValue::new(
                    semconv::EXCEPTION_MESSAGE,
                    "another HTTP/2 connection to this origin was ready first; hyper-util closed this one unused (ALPN upgraded to HTTP/2)",
                )],
            );
            span.set_status(Status::Ok);
            semconv::SETUP_OUTCOME_COALESCED
        }
    };
    span.set_attribute(KeyValue::new(
        semconv::HTTP_CONNECTION_SETUP_OUTCOME,
        outcome,
    ));
}

/// Ends a setup span whose trigger's fate is known (served, or failed
/// before a response: its miss is recorded then too): with the reason the
/// trigger's span records when its connect's miss is that one, else its
/// own.
fn end_with_trigger_reason(p: PendingSetup, reason: &SetupReason) {
    if p.trigger_miss {
        reason.hold(p);
    } else {
        end_setup(p, None);
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<RequestState>>> = const { RefCell::new(None) };
}

/// The request being polled on this thread, if it went through our middleware.
pub(crate) fn current() -> Option<Arc<RequestState>> {
    CURRENT.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// Makes `state` the current request on this thread until dropped.
pub(crate) struct RequestScope {
    previous: Option<Arc<RequestState>>,
}

impl RequestScope {
    pub(crate) fn enter(state: &Arc<RequestState>) -> Self {
        let previous = CURRENT
            .try_with(|c| c.borrow_mut().replace(state.clone()))
            .ok()
            .flatten();
        Self { previous }
    }
}

impl Drop for RequestScope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
    }
}
