//! The previous connection a miss names ([`Previous`]), read from the
//! registry's record of it: its id, idle time and request count at the
//! miss, and how it ended.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::miss::ConnectionEnd;
use crate::pool::record::ConnectionRecord;
use crate::pool::slot::Previous;

// Read from the registry's record, so it lives here, not in `slot` (which
// the registry imports).
impl Previous {
    /// `record` as the previous connection of a miss at `now`: its idle
    /// time counted from when its client's pool may have had it back
    /// ([`ConnectionRecord::idle_since`]), its request count so far, and
    /// `end`, how it ended (`None`: alive at the miss, as the release race
    /// names it).
    /// An end by the server that the kernel dates (the report of its
    /// socket's end) more than the keep-alive timeout it advertised after
    /// the connection went idle, under a client idle timeout this crate
    /// could not read (one it can read is compared at the response),
    /// carries that timeout (`kept_past_keep_alive`): the client's pool
    /// still held it then. Not the idle time at the miss, which may come
    /// long after a server's earlier close (a tester's server advertising
    /// 1 s but closing at 0.3 s read as a pool kept past it).
    /// An HTTP/1.1 connection whose closing response (`Connection: close`)
    /// the caller still holds, its body unread, counts from that
    /// response's headers instead
    /// ([`ConnectionRecord::idle_or_closed_since`]): hyper closed it on reading
    /// that response (a tester's concurrent late readers saw 185 ms where
    /// the server's last response was 62 ms old, counted from the response
    /// before).
    pub(crate) fn of(record: &ConnectionRecord, now: Instant, end: Option<ConnectionEnd>) -> Self {
        let idle = now.saturating_duration_since(record.idle_or_closed_since());
        let kept_past_keep_alive = record.server_keep_alive().filter(|keep_alive| {
            !record.client.idle_timeout_known
                && end.is_some_and(ConnectionEnd::by_server)
                && record.socket_end().is_some_and(|socket| {
                    socket
                        .seen_at
                        .saturating_duration_since(record.idle_since())
                        > *keep_alive
                })
        });
        Self {
            id: record.id(),
            idle,
            request_count: record.requests.load(Ordering::Relaxed),
            end,
            kept_past_keep_alive,
            warn_keep_alive: kept_past_keep_alive.is_some()
                && record.client.first_keep_alive_warning(),
        }
    }
}
