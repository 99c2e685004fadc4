//! Per-request overhead of the instrumentation, side by side in one run:
//! the same GET on a warm keep-alive loopback connection through
//! - `plain`: a plain reqwest client,
//! - `instrumented_no_subscriber`: the instrumented client with middleware,
//!   no tracing subscriber installed (what a user pays before export is set up),
//! - `instrumented_recording`: instrumented, with the tracing-opentelemetry
//!   layer and an SDK tracer provider recording every span (no exporter, so
//!   the network cost of export is not measured),
//! - `instrumented_recording_metrics`: as above plus an SDK meter provider
//!   aggregating every metric (a periodic reader whose hour-long interval
//!   never fires during the run; the exporter discards).
//!
//! Run: `cargo bench -p reqwest-conntrace --bench overhead`.

use std::sync::OnceLock;

use conntrace_lab::TestServer;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::SdkTracerProvider;
use reqwest_conntrace::{ConnTrace, otlp};
use tracing_subscriber::layer::SubscriberExt;

fn main() {
    // The workspace builds reqwest without a default crypto provider; the
    // plain client needs one (the instrumented one brings its own config).
    let _ = rustls::crypto::ring::default_provider().install_default();
    divan::main();
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    url: String,
    _server: TestServer,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let server = runtime
            .block_on(TestServer::start_plain())
            .expect("loopback server");
        let url = server.url("/");
        Fixture {
            runtime,
            url,
            _server: server,
        }
    })
}

#[divan::bench]
fn plain(bencher: divan::Bencher<'_, '_>) {
    let f = fixture();
    let client = reqwest::Client::new();
    bencher.bench_local(|| {
        f.runtime.block_on(async {
            let r = client.get(&f.url).send().await.expect("ok");
            r.bytes().await.expect("body")
        })
    });
}

#[divan::bench]
fn instrumented_no_subscriber(bencher: divan::Bencher<'_, '_>) {
    let client = ConnTrace::new()
        .instrument_client(reqwest::Client::builder())
        .build_with_middleware()
        .expect("client");
    get_repeatedly(bencher, &client);
}

#[divan::bench]
fn instrumented_recording(bencher: divan::Bencher<'_, '_>) {
    let provider = SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry().with(otlp::tracing_layer(&provider));
    let _guard = tracing::subscriber::set_default(subscriber);
    let client = ConnTrace::builder()
        .tracer_provider(&provider)
        .build()
        .instrument_client(reqwest::Client::builder())
        .build_with_middleware()
        .expect("client");
    get_repeatedly(bencher, &client);
}

#[divan::bench]
fn instrumented_recording_metrics(bencher: divan::Bencher<'_, '_>) {
    let provider = SdkTracerProvider::builder().build();
    let meters = SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(Discard)
                .with_interval(std::time::Duration::from_secs(3600))
                .build(),
        )
        .build();
    let subscriber = tracing_subscriber::registry().with(otlp::tracing_layer(&provider));
    let _guard = tracing::subscriber::set_default(subscriber);
    let client = ConnTrace::builder()
        .tracer_provider(&provider)
        .meter_provider(&meters)
        .build()
        .instrument_client(reqwest::Client::builder())
        .build_with_middleware()
        .expect("client");
    get_repeatedly(bencher, &client);
}

/// A metric exporter that drops everything (the bench measures recording,
/// not export).
#[derive(Debug)]
struct Discard;

impl PushMetricExporter for Discard {
    async fn export(&self, _metrics: &ResourceMetrics) -> OTelSdkResult {
        Ok(())
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: std::time::Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// Measures one GET of the fixture's URL (body read) per iteration.
fn get_repeatedly(
    bencher: divan::Bencher<'_, '_>,
    client: &reqwest_middleware::ClientWithMiddleware,
) {
    let f = fixture();
    bencher.bench_local(|| {
        f.runtime.block_on(async {
            let r = client.get(&f.url).send().await.expect("ok");
            r.bytes().await.expect("body")
        })
    });
}
