//! A typed Forma model inside an HTTP service: the training example's
//! LeNet ([`forma_examples::train::Cnn`]) loaded from its checkpoint and
//! served over HTTP, with concurrent requests batched into one forward pass.
//!
//! ```sh
//! cargo run --release -p forma-examples --example train   # writes runs/train/best.safetensors
//! cargo run --release -p forma-serve -- --checkpoint runs/train/best.safetensors
//! ```
//!
//! Then, from another shell, a real MNIST test digit (784 pixels in
//! `0..=1`, row by row; [`sample`]):
//!
//! ```sh
//! cargo run --release -p forma-serve -- --dump-sample sample.json   # prints "label: 7"
//! curl -s localhost:8080/predict -H 'content-type: application/json' -d @sample.json
//! # {"class":7,"probabilities":[...10 values...],"logits":[...]}
//! curl -s localhost:8080/predict -H 'content-type: application/json' \
//!   -d '{"batch": [[...784 values...], [...784 values...]]}'
//! # {"predictions":[{"class":..,"probabilities":[..],"logits":[..]}, ...]}
//! curl -s localhost:8080/health
//! curl -s localhost:8080/metrics        # Prometheus text
//! curl -s localhost:8080/metrics.json   # the same counters as JSON
//! ```
//!
//! - **Startup**: the checkpoint is loaded strictly before the first
//!   connection is accepted; a missing file, a corrupt one or one that does
//!   not fit the model stops the service with the reason
//!   ([`ServeError::Checkpoint`]).
//! - **Inference mode**: the model is put in eval mode once, and each
//!   forward pass runs under `no_grad`, taken on the thread that runs it
//!   (Forma's grad mode is per thread, like PyTorch's).
//! - **Sharing**: one [`Classifier`] behind an `Arc`; a compile-time
//!   assertion in [`model`] checks that it is `Send + Sync`.
//! - **Batching** ([`batcher`]): requests queue to a batcher task that
//!   gathers up to `--max-batch` images or waits `--max-wait-ms`, runs one
//!   forward pass on a blocking thread, and answers each request through a
//!   oneshot channel.
//! - **Validation** ([`handlers`]): wrong length, out-of-range or non-finite
//!   pixels, malformed JSON, wrong types, missing fields, a wrong content type
//!   and oversize bodies each get a 4xx with `{"error": ..., "kind": ...}`;
//!   a full queue gets 503.
//! - **Metrics** ([`metrics`]): `GET /metrics` in Prometheus's text format
//!   (`forma_serve_*`: requests by route and status, request duration and
//!   batch size histograms, errors by kind, a latency summary); `GET
//!   /metrics.json` the same as JSON: requests served, errors by kind,
//!   batches, mean batch size, latency p50/p99.
//! - **Logs**: one `tracing` line per request (method, path, status,
//!   latency in ms, and the number of images of a prediction), which the
//!   binary writes to stderr (5xx answers at `warn`, the rest at `info`);
//!   `RUST_LOG` sets the level (default `info`).
//! - **Slow and silent clients**: a connection must send a request's headers
//!   within `--header-timeout-ms` (10 s; counted from when the server is
//!   ready to read them, so it is also the idle timeout of a kept-alive
//!   connection) and its body within `--body-timeout-ms` (30 s; 408
//!   `body_timeout`); at most `--max-connections` (512) are served at once,
//!   the rest wait in the listener's backlog.
//! - **Shutdown**: on ctrl-c or SIGTERM the listener closes, requests in
//!   flight are answered, then the batcher drains and stops; connections
//!   still open after `--shutdown-grace-ms` (10 s), such as one stuck
//!   mid-request, are closed.

pub mod batcher;
pub mod config;
pub mod error;
pub mod handlers;
pub mod metrics;
pub mod model;
pub mod sample;

pub use config::{parse_args, Args, Command, Config, Normalization};
pub use error::ServeError;
pub use metrics::Snapshot;
pub use model::{Classifier, Prediction};
pub use sample::Sample;

use forma::prelude::*;
use handlers::{AppState, Info};
use metrics::Metrics;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Loads `config.checkpoint` and serves it on `listener` until `shutdown`
/// completes, then finishes the requests in flight, stops the batcher and
/// returns.
///
/// ```
/// use forma::prelude::*;
/// use forma_examples::train::Cnn;
/// use forma_serve::{serve, Config, ServeError};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("forma-serve-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("model.safetensors");
/// Cnn::new(&mut Rng::seed_from(0)).save_safetensors(&path)?;
///
/// let rt = tokio::runtime::Runtime::new()?;
/// rt.block_on(async {
///     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
///     // Stops at once; a real service passes a ctrl-c future.
///     serve(listener, Config::new(&path), async {}).await?;
///     // A missing checkpoint is an error before anything is served.
///     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
///     let err = serve(listener, Config::new(dir.join("none.safetensors")), async {}).await;
///     assert!(matches!(err, Err(ServeError::Checkpoint(_))));
///     Ok::<_, Box<dyn std::error::Error>>(())
/// })?;
/// std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// [`ServeError::Config`] for a bad setting, [`ServeError::Checkpoint`] when
/// the weights cannot be loaded (nothing is served then), or an I/O error
/// from the listener.
pub async fn serve<F>(listener: TcpListener, config: Config, shutdown: F) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    config.validate()?;
    let (path, norm) = (config.checkpoint.clone(), config.normalization);
    // Reading and checking the weights is blocking work.
    let model = tokio::task::spawn_blocking(move || Classifier::load(path, norm))
        .await
        .map_err(|e| ServeError::Task(e.to_string()))??;
    serve_model(listener, model, config, shutdown).await
}

/// [`serve`] with a model already loaded (`config.checkpoint` is only
/// reported by `/health`; `config.normalization` is ignored for the model's
/// own).
///
/// # Errors
/// As [`serve`], without the checkpoint errors.
pub async fn serve_model<F>(
    listener: TcpListener,
    model: Classifier,
    config: Config,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    config.validate()?;
    let metrics = Arc::new(Metrics::default());
    let info = Info {
        status: "ok",
        model: "Cnn (LeNet, forma_examples::train::Cnn)",
        parameters: model.model().num_parameters(),
        checkpoint: config.checkpoint.display().to_string(),
        max_batch: config.max_batch,
        max_wait_ms: config.max_wait.as_secs_f64() * 1e3,
    };
    let (jobs, batcher) = batcher::spawn(
        Arc::new(model),
        config.max_batch,
        config.max_wait,
        config.queue_capacity,
        Arc::clone(&metrics),
    );
    let app = handlers::router(AppState {
        jobs,
        metrics,
        info: Arc::new(info),
        max_batch: config.max_batch,
        body_limit: config.body_limit,
        body_timeout: config.body_timeout,
    });
    let served = serve_connections(listener, app, &config, shutdown).await;
    // Every connection is closed and the router dropped, and with it the
    // last sender of the batcher's queue: the batcher answers what is still
    // queued, then sees the queue closed.
    batcher.await.map_err(|e| ServeError::Task(e.to_string()))?;
    served?;
    Ok(())
}

/// Accepts connections until `shutdown`, each served by hyper's HTTP/1 with
/// [`Config::header_timeout`], at most [`Config::max_connections`] at once.
/// On shutdown: stop accepting, ask every connection to close after its
/// current request, and close the ones still open after
/// [`Config::shutdown_grace`].
async fn serve_connections<F>(
    listener: TcpListener,
    app: axum::Router,
    config: &Config,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let graceful = GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_connections));
    let mut connections = tokio::task::JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: wait a little rather
                // than spin; the connection that failed is the client's loss.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        connections.spawn(async move {
            // A client that leaves or times out is not the server's error.
            let _ = conn.await;
            drop(slot);
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    drop(app);
    if tokio::time::timeout(config.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        connections.abort_all();
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Completes on ctrl-c, or on SIGTERM on Unix: the binary's shutdown signal.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        // If the handler cannot be installed, wait on the other signal only.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
