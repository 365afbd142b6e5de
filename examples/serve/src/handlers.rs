//! The HTTP routes: `POST /predict`, `GET /health`, `GET /metrics`
//! (Prometheus text), `GET /metrics.json`, and JSON errors for everything
//! else; and the middleware that logs and counts every answer.

use crate::batcher::{BatchError, Job};
use crate::metrics::{Metrics, PROMETHEUS_CONTENT_TYPE};
use crate::model::Prediction;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forma_examples::digits::{PIXELS, SIDE};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// The body of `POST /predict`: exactly one of the two fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PredictRequest {
    /// One image: 784 pixels (28 rows of 28) in `0..=1`.
    pub pixels: Option<Vec<f32>>,
    /// Several images, each as `pixels`.
    pub batch: Option<Vec<Vec<f32>>>,
}

/// The answer to a `batch` request, in the order of the images.
#[derive(Debug, Serialize)]
pub struct BatchResponse {
    /// One prediction per image.
    pub predictions: Vec<Prediction>,
}

/// An error answer: `{"error": "...", "kind": "..."}` with a 4xx or 5xx
/// status. `kind` is also the key it is counted under in `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApiError {
    /// The HTTP status.
    #[serde(skip)]
    pub status: StatusCode,
    /// A stable name for the error.
    pub kind: &'static str,
    /// What was wrong, for a person.
    pub error: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, error: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            error: error.into(),
        }
    }

    fn invalid(kind: &'static str, error: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, kind, error)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(&self)).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let kind = match &r {
            JsonRejection::MissingJsonContentType(_) => "content_type",
            JsonRejection::JsonSyntaxError(_) => "bad_json",
            JsonRejection::JsonDataError(_) => "bad_field",
            JsonRejection::BytesRejection(_) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                "body_too_large"
            }
            _ => "bad_body",
        };
        ApiError::new(r.status(), kind, r.body_text())
    }
}

/// What the handlers share.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The batcher's queue.
    pub jobs: mpsc::Sender<Job>,
    /// The counters.
    pub metrics: Arc<Metrics>,
    /// What `/health` reports.
    pub info: Arc<Info>,
    /// The most images per request (the batcher's batch size).
    pub max_batch: usize,
    /// The largest body accepted.
    pub body_limit: usize,
    /// How long a body may take to arrive.
    pub body_timeout: std::time::Duration,
}

/// The service's description, as `GET /health` returns it.
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    /// Always `ok` while the service answers.
    pub status: &'static str,
    /// The model type.
    pub model: &'static str,
    /// Its number of parameters.
    pub parameters: usize,
    /// Where its weights came from.
    pub checkpoint: String,
    /// The batch size limit.
    pub max_batch: usize,
    /// The batching wait, in milliseconds.
    pub max_wait_ms: f64,
}

/// The service's routes: also the values of the `route` label in
/// `/metrics`, besides `other` for paths it does not have.
const ROUTES: [&str; 4] = ["/predict", "/health", "/metrics", "/metrics.json"];

/// How many images a `/predict` answer carried, kept in the response's
/// extensions for the request log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Images(pub usize);

/// The routes, with the body limit applied, every answer logged and counted.
pub fn router(state: AppState) -> Router {
    let limit = state.body_limit;
    Router::new()
        .route(ROUTES[0], post(predict))
        .route(ROUTES[1], get(health))
        .route(ROUTES[2], get(metrics))
        .route(ROUTES[3], get(metrics_json))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Also bounds bodies sent without a Content-Length (chunked).
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            body_in_time,
        ))
        // Outermost: sees the answers of `body_in_time` too, and times the
        // whole request, body included.
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Logs one line per request (method, path, status, latency, and the
/// number of images for a prediction) and counts it by route and status.
async fn observe(
    State(st): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let started = Instant::now();
    // The matched route, not the path: a label per arbitrary path would grow
    // `/metrics` without bound.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|m| ROUTES.into_iter().find(|&r| r == m.as_str()))
        .unwrap_or("other");
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    st.metrics.response(route, status, elapsed);
    let latency_ms = (elapsed.as_secs_f64() * 1e3 * 1e3).round() / 1e3;
    let images = response.extensions().get::<Images>().map(|i| i.0);
    macro_rules! log {
        ($level:expr) => {
            match images {
                Some(images) => tracing::event!(
                    $level,
                    %method, path, status, latency_ms, images, "request"
                ),
                None => tracing::event!($level, %method, path, status, latency_ms, "request"),
            }
        };
    }
    if response.status().is_server_error() {
        log!(tracing::Level::WARN);
    } else {
        log!(tracing::Level::INFO);
    }
    response
}

/// Reads the whole body within [`AppState::body_timeout`] (408
/// `body_timeout` past it) and at most [`AppState::body_limit`] bytes (413),
/// before any handler runs: a client that sends headers and then part of a
/// body, slowly or never, does not hold the connection open.
async fn body_in_time(
    State(st): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::body::{Body, HttpBody};
    let (parts, mut body) = req.into_parts();
    let limit = st.body_limit;
    let too_large = |size: String| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is {size} bytes; the limit is {limit}"),
        )
    };
    // A declared length past the limit is refused before reading a byte.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        let err = too_large(n.to_string());
        st.metrics.error(err.kind);
        return err.into_response();
    }
    let read = async {
        let mut buf = Vec::new();
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("reading the body failed: {e}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                if buf.len() + data.len() > limit {
                    return Err(too_large(format!("over {limit}")));
                }
                buf.extend_from_slice(&data);
            }
        }
        Ok(buf)
    };
    let err = match tokio::time::timeout(st.body_timeout, read).await {
        Ok(Ok(buf)) => return next.run(Request::from_parts(parts, Body::from(buf))).await,
        Ok(Err(e)) => e,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                st.body_timeout.as_millis()
            ),
        ),
    };
    st.metrics.error(err.kind);
    err.into_response()
}

async fn health(State(st): State<AppState>) -> Json<Info> {
    Json((*st.info).clone())
}

async fn metrics(State(st): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)],
        st.metrics.prometheus(),
    )
        .into_response()
}

async fn metrics_json(State(st): State<AppState>) -> Response {
    Json(st.metrics.snapshot()).into_response()
}

async fn not_found(State(st): State<AppState>, req: Request) -> ApiError {
    st.metrics.error("not_found");
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route {}; try POST /predict, GET /health, GET /metrics, GET /metrics.json",
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(State(st): State<AppState>, req: Request) -> ApiError {
    st.metrics.error("method_not_allowed");
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {}", req.uri().path(), req.method()),
    )
}

async fn predict(State(st): State<AppState>, req: Request) -> Response {
    let started = Instant::now();
    let _in_flight = st.metrics.start();
    match predict_inner(&st, req).await {
        Ok((mut response, images)) => {
            st.metrics.served(images, started.elapsed());
            response.extensions_mut().insert(Images(images));
            response
        }
        Err(e) => {
            st.metrics.error(e.kind);
            e.into_response()
        }
    }
}

async fn predict_inner(st: &AppState, req: Request) -> Result<(Response, usize), ApiError> {
    // Oversize bodies were refused by `body_in_time`, declared or not.
    let Json(body) = Json::<PredictRequest>::from_request(req, &()).await?;
    let (pixels, single) = match (body.pixels, body.batch) {
        (Some(p), None) => {
            check_image(&p, "pixels")?;
            (p, true)
        }
        (None, Some(rows)) => (flatten_batch(rows, st.max_batch)?, false),
        (None, None) => {
            return Err(ApiError::invalid(
                "missing_field",
                "missing field `pixels` (one image) or `batch` (a list of images)",
            ))
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "ambiguous",
                "give `pixels` or `batch`, not both",
            ))
        }
    };

    let (job, answer) = Job::new(pixels);
    let images = job.images;
    st.jobs.try_send(job).map_err(|e| match e {
        mpsc::error::TrySendError::Full(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many requests are waiting; retry later",
        ),
        mpsc::error::TrySendError::Closed(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the service is stopping",
        ),
    })?;
    let predictions = answer
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the batcher stopped before answering",
            )
        })?
        .map_err(|e: BatchError| match e {
            BatchError::Rejected(_) => ApiError::invalid("rejected_by_model", e.to_string()),
            BatchError::ModelFailed(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "model_failed",
                e.to_string(),
            ),
        })?;
    let response = if single {
        match predictions.into_iter().next() {
            Some(p) => Json(p).into_response(),
            None => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "model_failed",
                    "the batcher returned no prediction",
                ))
            }
        }
    } else {
        Json(BatchResponse { predictions }).into_response()
    };
    Ok((response, images))
}

/// Checks one image: its length and every value.
fn check_image(p: &[f32], name: &str) -> Result<(), ApiError> {
    if p.len() != PIXELS {
        return Err(ApiError::invalid(
            "wrong_length",
            format!(
                "`{name}` has {} values; an image is {PIXELS} ({SIDE}x{SIDE}, row by row)",
                p.len()
            ),
        ));
    }
    // JSON has no NaN, but a number past f32's range (1e39) reads as inf.
    if let Some(i) = p.iter().position(|v| !v.is_finite()) {
        return Err(ApiError::invalid(
            "non_finite",
            format!("`{name}[{i}]` is {}, not a finite number", p[i]),
        ));
    }
    if let Some(i) = p.iter().position(|v| !(0.0..=1.0).contains(v)) {
        return Err(ApiError::invalid(
            "out_of_range",
            format!("`{name}[{i}]` is {}; pixels are in 0..=1", p[i]),
        ));
    }
    Ok(())
}

/// Checks every image of a batch and joins them row after row.
fn flatten_batch(rows: Vec<Vec<f32>>, max_batch: usize) -> Result<Vec<f32>, ApiError> {
    if rows.is_empty() {
        return Err(ApiError::invalid("empty_batch", "`batch` has no images"));
    }
    if rows.len() > max_batch {
        return Err(ApiError::invalid(
            "batch_too_large",
            format!(
                "`batch` has {} images; at most {max_batch} per request",
                rows.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(rows.len() * PIXELS);
    for (i, row) in rows.iter().enumerate() {
        check_image(row, &format!("batch[{i}]"))?;
        out.extend_from_slice(row);
    }
    Ok(out)
}
