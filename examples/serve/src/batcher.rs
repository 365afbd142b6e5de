//! The batcher: one task that gathers concurrent requests into a batch (up
//! to a size, or until a deadline), runs one forward pass on a blocking
//! thread, and answers each request through its own oneshot channel.
//!
//! One batch runs at a time: the forward pass already uses every core
//! (Forma's kernels are parallel), and requests that arrive meanwhile queue
//! up to form the next batch, so batches grow with the load by themselves.

use crate::metrics::Metrics;
use crate::model::{Classifier, Prediction};
use forma_examples::digits::PIXELS;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

/// Why a request got no prediction.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// The forward pass panicked; the batcher carries on with the next batch.
    #[error("the model failed on this batch: {0}")]
    ModelFailed(String),
}

/// One request's images and where to send their predictions.
#[derive(Debug)]
pub struct Job {
    /// `images` rows of [`PIXELS`] values each.
    pub pixels: Vec<f32>,
    /// How many images.
    pub images: usize,
    /// Where the answer goes (in the order of the rows).
    pub reply: oneshot::Sender<Result<Vec<Prediction>, BatchError>>,
}

impl Job {
    /// A job for `pixels` (a whole number of images) and the receiver of
    /// its answer.
    pub fn new(pixels: Vec<f32>) -> (Self, oneshot::Receiver<Result<Vec<Prediction>, BatchError>>) {
        let (reply, rx) = oneshot::channel();
        let images = pixels.len() / PIXELS;
        (
            Job {
                pixels,
                images,
                reply,
            },
            rx,
        )
    }
}

/// Starts the batcher on the current runtime. It stops once every sender
/// is dropped and the queue is drained, answering every job it received.
pub fn spawn(
    model: Arc<Classifier>,
    max_batch: usize,
    max_wait: Duration,
    queue_capacity: usize,
    metrics: Arc<Metrics>,
) -> (mpsc::Sender<Job>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(queue_capacity);
    let task = tokio::spawn(run(model, rx, max_batch, max_wait, metrics));
    (tx, task)
}

async fn run(
    model: Arc<Classifier>,
    mut rx: mpsc::Receiver<Job>,
    max_batch: usize,
    max_wait: Duration,
    metrics: Arc<Metrics>,
) {
    // A job that did not fit in the previous batch starts the next one.
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => break,
            },
        };
        let deadline = Instant::now() + max_wait;
        let mut images = first.images;
        let mut jobs = vec![first];
        while images < max_batch {
            match timeout_at(deadline, rx.recv()).await {
                Ok(Some(job)) if images + job.images > max_batch => {
                    carried = Some(job);
                    break;
                }
                Ok(Some(job)) => {
                    images += job.images;
                    jobs.push(job);
                }
                // Closed (shutting down: run what is here) or timed out.
                Ok(None) | Err(_) => break,
            }
        }
        run_batch(&model, jobs, images, &metrics).await;
    }
}

/// One forward pass over `jobs`, answered job by job.
async fn run_batch(model: &Arc<Classifier>, jobs: Vec<Job>, images: usize, metrics: &Metrics) {
    let mut pixels = Vec::with_capacity(images * PIXELS);
    let mut replies = Vec::with_capacity(jobs.len());
    for job in jobs {
        pixels.extend_from_slice(&job.pixels);
        replies.push((job.images, job.reply));
    }
    let requests = replies.len();
    let model = Arc::clone(model);
    // The forward pass is seconds of CPU at worst: off the async workers, so
    // that accepting and parsing requests goes on meanwhile.
    let result = tokio::task::spawn_blocking(move || model.predict(&pixels)).await;
    metrics.batch(images, requests);
    match result {
        Ok(predictions) => {
            let mut rest = predictions.into_iter();
            for (n, reply) in replies {
                // A client that went away has dropped its receiver: nothing to do.
                let _ = reply.send(Ok(rest.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            let why = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into()),
                Err(e) => e.to_string(),
            };
            for (_, reply) in replies {
                let _ = reply.send(Err(BatchError::ModelFailed(why.clone())));
            }
        }
    }
}
