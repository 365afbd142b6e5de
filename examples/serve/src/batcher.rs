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
    /// The model refused the batch's input (a shape, an argument or an index
    /// it cannot take): the client's to fix, answered 422.
    #[error("the model cannot take this input: {0}")]
    Rejected(String),
    /// The forward pass failed for a reason of the server's (a backend or
    /// device failure), answered 500; the batcher carries on with the next
    /// batch.
    #[error("the model failed on this batch: {0}")]
    ModelFailed(String),
}

impl BatchError {
    /// The request's share of a failed forward pass: input errors are the
    /// client's, the rest the server's.
    fn from_model(e: &forma::Error) -> Self {
        use forma::Error as E;
        match e.innermost() {
            E::Shape(_)
            | E::InvalidArgument { .. }
            | E::IndexOutOfRange { .. }
            | E::DataLength { .. } => BatchError::Rejected(e.to_string()),
            _ => BatchError::ModelFailed(e.to_string()),
        }
    }
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
    // The model reports a bad input or a failure as an error value, never
    // as a panic. A blocking task that does not finish normally (a panic,
    // which is a bug, or a runtime shutting down) is answered as a server
    // error without looking inside.
    let result = tokio::task::spawn_blocking(move || model.try_predict(&pixels)).await;
    metrics.batch(images, requests);
    let result = match result {
        Ok(r) => r.map_err(|e| BatchError::from_model(&e)),
        Err(join) => Err(BatchError::ModelFailed(format!(
            "the forward pass did not finish: {join}"
        ))),
    };
    match result {
        Ok(predictions) => {
            let mut rest = predictions.into_iter();
            for (n, reply) in replies {
                // A client that went away has dropped its receiver: nothing to do.
                let _ = reply.send(Ok(rest.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            for (_, reply) in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Normalization;
    use forma::prelude::*;
    use forma_examples::train::Cnn;

    fn classifier() -> Arc<Classifier> {
        let model = Cnn::new(&mut Rng::seed_from(0));
        Arc::new(Classifier::new(
            model,
            Normalization {
                mean: 0.0,
                std: 1.0,
            },
        ))
    }

    #[tokio::test]
    async fn a_batch_the_model_refuses_is_answered_as_rejected_not_a_panic() {
        let metrics = Metrics::default();
        // Half an image: the model's input shape cannot hold it.
        let (job, answer) = Job::new(vec![0.5; PIXELS / 2]);
        run_batch(&classifier(), vec![job], 1, &metrics).await;
        match answer.await.expect("answered") {
            Err(BatchError::Rejected(why)) => {
                assert!(
                    why.contains("not a whole number of 784-pixel images"),
                    "{why}"
                )
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_good_batch_is_answered_per_job() {
        let metrics = Metrics::default();
        let (a, ra) = Job::new(vec![0.1; PIXELS]);
        let (b, rb) = Job::new(vec![0.9; 2 * PIXELS]);
        run_batch(&classifier(), vec![a, b], 3, &metrics).await;
        let a = ra.await.expect("answered").expect("a prediction");
        let b = rb.await.expect("answered").expect("predictions");
        assert_eq!((a.len(), b.len()), (1, 2));
        let sum: f32 = a[0].probabilities.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5, "{sum}");
    }
}
