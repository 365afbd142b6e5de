//! Counters behind `GET /metrics` (Prometheus text) and `GET
//! /metrics.json`: requests by route and status, errors by kind, batches,
//! latency.
//!
//! The Prometheus text exposition format (version 0.0.4) is written here by
//! hand: a few `# HELP`/`# TYPE` lines and `name{label="value"} number`
//! samples need no client library.

use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How many recent latencies the percentiles are taken over.
const LATENCY_WINDOW: usize = 10_000;

/// The `Content-Type` of `GET /metrics`.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds of the request-duration buckets, in seconds.
const DURATION_BUCKETS: [f64; 14] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the batch-size buckets (images or requests per forward
/// pass): powers of two, as batch sizes tend to be.
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// A Prometheus histogram: a count per bucket, their sum and how many.
#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative), the last past every bound.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// Writes the `_bucket` (cumulative), `_sum` and `_count` samples;
    /// `labels` are the series' own, written before `le`.
    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, n) in self.counts.iter().enumerate() {
            cumulative += n;
            let le = self
                .bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {}", braces(labels), self.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(labels), self.count);
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format
/// wants.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes a metric family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The service's counters, shared by the handlers and the batcher.
#[derive(Debug, Default)]
pub struct Metrics {
    in_flight: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    served: u64,
    images: u64,
    errors: BTreeMap<&'static str, u64>,
    batches: u64,
    batch_images: u64,
    batch_requests: u64,
    multi_request_batches: u64,
    largest_batch: u64,
    latencies_ms: VecDeque<f64>,
    /// Every served prediction's latency added up, in seconds.
    latency_sum_s: f64,
    /// HTTP answers by route and status.
    responses: BTreeMap<(&'static str, u16), u64>,
    /// HTTP request durations by route.
    durations: BTreeMap<&'static str, Histogram>,
    batch_images_hist: Histogram,
    batch_requests_hist: Histogram,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            served: 0,
            images: 0,
            errors: BTreeMap::new(),
            batches: 0,
            batch_images: 0,
            batch_requests: 0,
            multi_request_batches: 0,
            largest_batch: 0,
            latencies_ms: VecDeque::new(),
            latency_sum_s: 0.0,
            responses: BTreeMap::new(),
            durations: BTreeMap::new(),
            batch_images_hist: Histogram::new(&BATCH_BUCKETS),
            batch_requests_hist: Histogram::new(&BATCH_BUCKETS),
        }
    }
}

/// A copy of the counters, as `GET /metrics.json` returns it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// Predictions answered with 200.
    pub requests_served: u64,
    /// Images predicted in them.
    pub images_served: u64,
    /// `/predict` requests being handled now.
    pub requests_in_flight: u64,
    /// Answers other than 200, by kind (`bad_json`, `wrong_length`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Forward passes run.
    pub batches_run: u64,
    /// Mean images per forward pass.
    pub mean_batch_size: f64,
    /// Mean requests per forward pass.
    pub mean_requests_per_batch: f64,
    /// Forward passes that served more than one request.
    pub multi_request_batches: u64,
    /// The most images in one forward pass.
    pub largest_batch: u64,
    /// Latency of the last served predictions (up to 10,000), from the
    /// request's arrival to its answer, in milliseconds.
    pub latency_ms: Latency,
}

/// Latency percentiles (nearest rank).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Latency {
    /// How many latencies these are over.
    pub samples: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Counts a `/predict` request as in flight until dropped (also when the
/// client goes away and the handler is cancelled).
#[derive(Debug)]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `q` quantile of sorted `v` by nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Metrics {
    // A panic while holding the lock cannot leave the counters inconsistent
    // in a way that matters, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks a request as started.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(self))
    }

    /// Records a served prediction of `images` images that took `latency`.
    pub fn served(&self, images: usize, latency: Duration) {
        let mut m = self.lock();
        m.served += 1;
        m.images += images as u64;
        if m.latencies_ms.len() == LATENCY_WINDOW {
            m.latencies_ms.pop_front();
        }
        m.latencies_ms.push_back(latency.as_secs_f64() * 1e3);
        m.latency_sum_s += latency.as_secs_f64();
    }

    /// Records an HTTP answer: `route` is the matched route (`/predict`,
    /// ...) or `other` for a path the service does not have, so that
    /// arbitrary paths cannot grow the label set without bound.
    pub fn response(&self, route: &'static str, status: u16, duration: Duration) {
        let mut m = self.lock();
        *m.responses.entry((route, status)).or_default() += 1;
        m.durations
            .entry(route)
            .or_insert_with(|| Histogram::new(&DURATION_BUCKETS))
            .observe(duration.as_secs_f64());
    }

    /// Records an error answer of kind `kind`.
    pub fn error(&self, kind: &'static str) {
        *self.lock().errors.entry(kind).or_default() += 1;
    }

    /// Records a forward pass over `images` images from `requests` requests.
    pub fn batch(&self, images: usize, requests: usize) {
        let mut m = self.lock();
        m.batches += 1;
        m.batch_images += images as u64;
        m.batch_requests += requests as u64;
        m.multi_request_batches += u64::from(requests > 1);
        m.largest_batch = m.largest_batch.max(images as u64);
        m.batch_images_hist.observe(images as f64);
        m.batch_requests_hist.observe(requests as f64);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_of(&self.lock())
    }

    fn snapshot_of(&self, m: &Inner) -> Snapshot {
        let mut lat: Vec<f64> = m.latencies_ms.iter().copied().collect();
        lat.sort_by(f64::total_cmp);
        let per_batch = |x: u64| {
            if m.batches == 0 {
                0.0
            } else {
                x as f64 / m.batches as f64
            }
        };
        Snapshot {
            requests_served: m.served,
            images_served: m.images,
            requests_in_flight: self.in_flight.load(Ordering::SeqCst),
            errors: m.errors.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            batches_run: m.batches,
            mean_batch_size: per_batch(m.batch_images),
            mean_requests_per_batch: per_batch(m.batch_requests),
            multi_request_batches: m.multi_request_batches,
            largest_batch: m.largest_batch,
            latency_ms: Latency {
                samples: lat.len(),
                p50: percentile(&lat, 0.50),
                p99: percentile(&lat, 0.99),
                max: lat.last().copied().unwrap_or(0.0),
            },
        }
    }
}

impl Metrics {
    /// The counters in the Prometheus text exposition format (version
    /// 0.0.4), every family with its `# HELP` and `# TYPE` lines, metric
    /// names prefixed with `forma_serve_`.
    pub fn prometheus(&self) -> String {
        // One lock for every family, so that they agree with each other.
        let m = self.lock();
        let snap = self.snapshot_of(&m);
        let mut out = String::new();
        let o = &mut out;

        family(
            o,
            "forma_serve_http_requests_total",
            "counter",
            "HTTP requests answered, by route (`other` for unknown paths) and status.",
        );
        for ((route, status), n) in &m.responses {
            let _ = writeln!(
                o,
                "forma_serve_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                escape(route)
            );
        }
        family(
            o,
            "forma_serve_http_request_duration_seconds",
            "histogram",
            "Time from a request's arrival to its answer, by route.",
        );
        for (route, h) in &m.durations {
            h.write(
                o,
                "forma_serve_http_request_duration_seconds",
                &format!("route=\"{}\"", escape(route)),
            );
        }

        family(
            o,
            "forma_serve_predictions_total",
            "counter",
            "Prediction requests answered with 200.",
        );
        let _ = writeln!(o, "forma_serve_predictions_total {}", snap.requests_served);
        family(
            o,
            "forma_serve_images_total",
            "counter",
            "Images predicted in them.",
        );
        let _ = writeln!(o, "forma_serve_images_total {}", snap.images_served);
        family(
            o,
            "forma_serve_requests_in_flight",
            "gauge",
            "Prediction requests being handled now.",
        );
        let _ = writeln!(
            o,
            "forma_serve_requests_in_flight {}",
            snap.requests_in_flight
        );
        family(
            o,
            "forma_serve_errors_total",
            "counter",
            "Answers other than 200, by kind (the `kind` of the JSON error).",
        );
        for (kind, n) in &m.errors {
            let _ = writeln!(
                o,
                "forma_serve_errors_total{{kind=\"{}\"}} {n}",
                escape(kind)
            );
        }

        family(
            o,
            "forma_serve_batch_images",
            "histogram",
            "Images per forward pass (its _count is the number of forward passes).",
        );
        m.batch_images_hist.write(o, "forma_serve_batch_images", "");
        family(
            o,
            "forma_serve_batch_requests",
            "histogram",
            "Requests per forward pass.",
        );
        m.batch_requests_hist
            .write(o, "forma_serve_batch_requests", "");
        family(
            o,
            "forma_serve_multi_request_batches_total",
            "counter",
            "Forward passes that served more than one request.",
        );
        let _ = writeln!(
            o,
            "forma_serve_multi_request_batches_total {}",
            snap.multi_request_batches
        );
        family(
            o,
            "forma_serve_largest_batch_images",
            "gauge",
            "The most images in one forward pass so far.",
        );
        let _ = writeln!(o, "forma_serve_largest_batch_images {}", snap.largest_batch);

        family(o, "forma_serve_prediction_latency_seconds", "summary",
            "Latency of served predictions, arrival to answer; quantiles over the last 10000 (1 is the largest).");
        let lat = &snap.latency_ms;
        for (q, v) in [("0.5", lat.p50), ("0.99", lat.p99), ("1", lat.max)] {
            let _ = writeln!(
                o,
                "forma_serve_prediction_latency_seconds{{quantile=\"{q}\"}} {}",
                v / 1e3
            );
        }
        let _ = writeln!(
            o,
            "forma_serve_prediction_latency_seconds_sum {}",
            m.latency_sum_s
        );
        let _ = writeln!(
            o,
            "forma_serve_prediction_latency_seconds_count {}",
            m.served
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.5), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn batch_counters() {
        let m = Metrics::default();
        m.batch(3, 3);
        m.batch(1, 1);
        let s = m.snapshot();
        assert_eq!(s.batches_run, 2);
        assert_eq!(s.mean_batch_size, 2.0);
        assert_eq!(s.multi_request_batches, 1);
        assert_eq!(s.largest_batch, 3);
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(&[1.0, 2.0, 4.0]);
        for v in [1.0, 1.5, 3.0, 9.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.write(&mut out, "x", "a=\"b\"");
        assert_eq!(
            out,
            "x_bucket{a=\"b\",le=\"1\"} 1\n\
             x_bucket{a=\"b\",le=\"2\"} 2\n\
             x_bucket{a=\"b\",le=\"4\"} 3\n\
             x_bucket{a=\"b\",le=\"+Inf\"} 4\n\
             x_sum{a=\"b\"} 14.5\n\
             x_count{a=\"b\"} 4\n"
        );
        let mut out = String::new();
        Histogram::new(&[1.0]).write(&mut out, "y", "");
        assert_eq!(
            out,
            "y_bucket{le=\"1\"} 0\ny_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }

    #[test]
    fn prometheus_text_has_every_family() {
        let m = Metrics::default();
        m.response("/predict", 200, Duration::from_millis(3));
        m.response("/predict", 422, Duration::from_millis(1));
        m.response("/predict", 200, Duration::from_millis(30));
        m.served(2, Duration::from_millis(3));
        m.error("wrong_length");
        m.batch(2, 1);
        let text = m.prometheus();
        for line in [
            "# TYPE forma_serve_http_requests_total counter",
            "forma_serve_http_requests_total{route=\"/predict\",status=\"200\"} 2",
            "forma_serve_http_requests_total{route=\"/predict\",status=\"422\"} 1",
            "forma_serve_http_request_duration_seconds_bucket{route=\"/predict\",le=\"0.005\"} 2",
            "forma_serve_http_request_duration_seconds_bucket{route=\"/predict\",le=\"+Inf\"} 3",
            "forma_serve_http_request_duration_seconds_count{route=\"/predict\"} 3",
            "forma_serve_predictions_total 1",
            "forma_serve_images_total 2",
            "forma_serve_errors_total{kind=\"wrong_length\"} 1",
            "forma_serve_batch_images_bucket{le=\"1\"} 0",
            "forma_serve_batch_images_bucket{le=\"2\"} 1",
            "forma_serve_batch_images_sum 2",
            "forma_serve_batch_images_count 1",
            "forma_serve_prediction_latency_seconds{quantile=\"0.5\"} 0.003",
            "forma_serve_prediction_latency_seconds_count 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // Every sample's family was introduced by HELP and TYPE lines.
        let mut typed = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.push(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(
                    typed.iter().any(|t| name == t
                        || name
                            .strip_prefix(t.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))),
                    "{name} has no TYPE line"
                );
            }
        }
    }
}
