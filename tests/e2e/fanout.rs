//! The fan-out helper: which batches paid for new connections, read off the
//! parent span alone, checked against the server's connection count.

use conntrace_lab::TestServer;
use reqwest_conntrace::{fan_out, semconv};

use crate::support::*;

/// Two fan-outs of five batches against an idle limit of two: the first pays
/// five connections; the second reuses two and pays three; batch 3 asks for
/// a slow response and is named the slowest.
#[tokio::test]
async fn fan_out_names_the_batches_that_paid_for_new_connections() {
    let t = telemetry();
    let server = TestServer::builder().start().await.expect("server");
    let client = t
        .conntrace()
        .instrument_client(reqwest::Client::builder())
        .pool_max_idle_per_host(2)
        .build_with_middleware()
        .expect("client");
    let run = || {
        fan_out((0..5).map(|i| {
            let client = client.clone();
            let url = server.url(if i == 3 { "/delay/150" } else { "/delay/30" });
            async move {
                let r = client.get(url).send().await.expect("request");
                r.bytes().await.expect("body")
            }
        }))
    };
    let first = run().await;
    assert_eq!(first.len(), 5, "outputs in order");
    assert_eq!(server.accepted_connections(), 5);
    run().await;
    let accepted = server.accepted_connections();
    assert_eq!(accepted, 8, "two idle connections kept, three new");

    let mut parents = t.named("fan_out");
    parents.sort_by_key(|s| s.start_time);
    assert_eq!(parents.len(), 2);
    for (parent, paid) in parents.iter().zip([5, 3]) {
        assert_eq!(i64_attr(parent, semconv::FAN_OUT_BATCHES), Some(5));
        assert_eq!(
            i64_attr(parent, semconv::FAN_OUT_BATCHES_WITH_NEW_CONNECTION),
            Some(paid)
        );
        assert_eq!(
            i64_attr(parent, semconv::FAN_OUT_SLOWEST_BATCH_INDEX),
            Some(3)
        );
        let slowest = f64_attr(parent, semconv::FAN_OUT_SLOWEST_BATCH_DURATION).expect("duration");
        assert!(slowest >= 0.15, "slowest batch took its 150 ms: {slowest}");
        let max = f64_attr(parent, semconv::FAN_OUT_WAIT_TIME_MAX).expect("max wait");
        let total = f64_attr(parent, semconv::FAN_OUT_WAIT_TIME_TOTAL).expect("total wait");
        assert!(
            max > 0.0 && total >= max,
            "misses waited for their connects"
        );

        // Batch spans are the parent's children, and each request hangs
        // under its batch; a batch's flag matches its request's reuse.
        let batches = t.children(parent);
        assert_eq!(batches.len(), 5);
        let mut flagged = 0;
        for batch in &batches {
            let requests = t.children(batch);
            assert_eq!(requests.len(), 1, "one request per batch");
            assert_eq!(i64_attr(batch, semconv::FAN_OUT_BATCH_REQUESTS), Some(1));
            let reused = bool_attr(&requests[0], semconv::HTTP_CONNECTION_REUSED).expect("reused");
            let new = bool_attr(batch, semconv::FAN_OUT_BATCH_NEW_CONNECTION).expect("flag");
            assert_eq!(new, !reused);
            flagged += i64::from(new);
            assert!(i64_attr(batch, semconv::FAN_OUT_BATCH_INDEX).is_some());
        }
        assert_eq!(flagged, paid);
    }
}
