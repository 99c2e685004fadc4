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
    /// time counted from its last activity, its request count so far, and
    /// `end`, how it ended (`None`: alive at the miss, as the release race
    /// names it).
    pub(crate) fn of(record: &ConnectionRecord, now: Instant, end: Option<ConnectionEnd>) -> Self {
        Self {
            id: record.id(),
            idle: now.saturating_duration_since(record.last_activity()),
            request_count: record.requests.load(Ordering::Relaxed),
            end,
        }
    }
}
