//! Counters behind `GET /metrics`: requests, errors by kind, batches, latency.

use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How many recent latencies the percentiles are taken over.
const LATENCY_WINDOW: usize = 10_000;

/// The service's counters, shared by the handlers and the batcher.
#[derive(Debug, Default)]
pub struct Metrics {
    in_flight: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
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
}

/// A copy of the counters, as `GET /metrics` returns it (JSON).
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
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let m = self.lock();
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
}
