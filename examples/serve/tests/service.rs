//! The service end to end, in process: a seeded model saved to a temporary
//! checkpoint, served on 127.0.0.1:0, and talked to over plain HTTP/1.1
//! (written by hand over a TcpStream, to add no client crate to the build).
//!
//! Checked: a burst of concurrent requests answered exactly as the model
//! answers each input alone (class equal, probabilities within 1e-5,
//! logits within 1e-4), batching observed in `/metrics.json` and in the
//! Prometheus text of `/metrics` (parsed, every family checked for its HELP
//! and TYPE lines), every kind of malformed request refused with its status
//! and JSON message and counted by route and status, `/health`, bad
//! checkpoints refused at startup, a graceful
//! shutdown that answers the requests in flight, silent and slow clients
//! timed out (nothing sent, half a request line, part of a body, an idle
//! kept-alive connection), the connection cap, the binary stopping
//! within its grace period on SIGTERM while a client holds half a request,
//! and the binary's first hour: `--dump-sample` on MNIST-format files (and
//! its error when they are missing), that body sent, one log line for it,
//! and a misspelled flag answered with clap's suggestion.

use forma::core::tape::no_grad;
use forma::prelude::*;
use forma_examples::digits::{render, CLASSES};
use forma_examples::train::{Cnn, Images, LinearModel, Logits};
use forma_serve::{serve, Config, Normalization, ServeError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const SEED: u64 = 7;
/// Not the identity, so that a service that skipped it would be caught.
const NORM: Normalization = Normalization {
    mean: 0.13,
    std: 0.31,
};

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "forma-serve-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The seeded model, and its checkpoint written in `dir`.
fn model_and_checkpoint(dir: &TempDir) -> (Cnn, PathBuf) {
    let model = Cnn::new(&mut Rng::seed_from(SEED));
    let path = dir.0.join("model.safetensors");
    model.save_safetensors(&path).unwrap();
    (model, path)
}

/// The model run on one image alone, as the service should answer it.
fn reference(model: &Cnn, pixels: &[f32]) -> (usize, Vec<f32>, Vec<f32>) {
    let _g = no_grad();
    let x: Vec<f32> = pixels.iter().map(|p| (p - NORM.mean) / NORM.std).collect();
    let x = Images::from_vec(x, (Dyn(1), C, C, C)).unwrap();
    let logits: Logits = model.forward(x);
    let probs = logits.softmax::<1>().to_vec();
    let class = logits.argmax::<1>().to_vec()[0] as usize;
    (class, probs, logits.to_vec())
}

/// Handwriting-like test images in `0..=1`.
fn images(n: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng::seed_from(99);
    (0..n)
        .map(|i| {
            render((i % 10) as u8, &mut rng)
                .iter()
                .map(|&p| f32::from(p) / 255.0)
                .collect()
        })
        .collect()
}

/// A running service and the means to stop it.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

async fn start(config: Config) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, config, async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop: Some(stop),
        task,
    }
}

impl Server {
    /// Signals shutdown and waits for `serve` to return.
    async fn shutdown(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("serve did not return after shutdown")
            .unwrap()
            .unwrap();
    }
}

fn config(path: PathBuf) -> Config {
    let mut c = Config::new(path);
    c.normalization = NORM;
    c
}

/// An HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
}

/// An HTTP answer as text.
#[derive(Debug)]
struct RawReply {
    status: u16,
    /// The status line and headers.
    head: String,
    body: String,
}

/// Sends `head` (the request line and headers, without the blank line) and
/// `body` on a fresh connection and reads the whole answer, a JSON body.
async fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> std::io::Result<Reply> {
    let RawReply { status, body, .. } = exchange_raw(addr, head, body).await?;
    let body = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("answer {status} is not JSON ({e}): {body:?}"));
    Ok(Reply { status, body })
}

/// [`exchange`] with the body left as text.
async fn exchange_raw(addr: SocketAddr, head: &str, body: &[u8]) -> std::io::Result<RawReply> {
    let mut s = TcpStream::connect(addr).await?;
    let mut req = format!("{head}\r\nHost: {addr}\r\nConnection: close\r\n\r\n").into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8(raw).expect("utf-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok(RawReply {
        status,
        head: head.to_string(),
        body,
    })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (len, rest) = s.split_once("\r\n").expect("chunk size");
        let len = usize::from_str_radix(len.trim(), 16).expect("hex chunk size");
        if len == 0 {
            return out;
        }
        out.push_str(&rest[..len]);
        s = &rest[len + 2..];
    }
}

async fn post(addr: SocketAddr, content_type: Option<&str>, body: &str) -> Reply {
    let ct = content_type.map_or(String::new(), |c| format!("\r\nContent-Type: {c}"));
    let head = format!(
        "POST /predict HTTP/1.1{ct}\r\nContent-Length: {}",
        body.len()
    );
    exchange(addr, &head, body.as_bytes()).await.unwrap()
}

async fn post_json(addr: SocketAddr, body: &Value) -> Reply {
    post(addr, Some("application/json"), &body.to_string()).await
}

async fn get(addr: SocketAddr, path: &str) -> Reply {
    exchange(addr, &format!("GET {path} HTTP/1.1"), b"")
        .await
        .unwrap()
}

/// Parses Prometheus's text format (0.0.4): every sample as `name{labels}`
/// (labels as written) to its value. Checks that each family has a HELP
/// line then a TYPE line before its samples, and that every sample belongs
/// to a family (`_bucket`, `_sum` and `_count` to a histogram or summary).
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut helped = Vec::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty(), "{name} has an empty HELP");
            helped.push(name.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary"].contains(&kind),
                "{line}"
            );
            assert_eq!(
                helped.last().map(String::as_str),
                Some(name),
                "TYPE before HELP: {line}"
            );
            assert!(
                typed.insert(name.to_string(), kind.to_string()).is_none(),
                "{line} twice"
            );
        } else {
            assert!(!line.starts_with('#'), "an unknown comment: {line}");
            let (key, value) = line.rsplit_once(' ').expect("name value");
            let name = key.split('{').next().unwrap();
            let family = typed.iter().find(|(f, kind)| {
                name == f.as_str()
                    || (["histogram", "summary"].contains(&kind.as_str())
                        && name
                            .strip_prefix(f.as_str())
                            .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s)))
            });
            assert!(family.is_some(), "{name} has no TYPE line before it");
            if key.contains('{') {
                assert!(key.ends_with('}'), "{line}");
            }
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(
                samples.insert(key.to_string(), value).is_none(),
                "{key} twice"
            );
        }
    }
    samples
}

/// `GET /metrics`, its content type checked, parsed.
async fn prometheus(addr: SocketAddr) -> BTreeMap<String, f64> {
    let r = exchange_raw(addr, "GET /metrics HTTP/1.1", b"")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        r.head
    );
    parse_prometheus(&r.body)
}

/// The value of sample `key` (`name{labels}`), failing with the whole set.
fn sample(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {m:#?}"))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// Checks one answered prediction against the model run on `pixels` alone.
fn check_prediction(model: &Cnn, pixels: &[f32], got: &Value) {
    let (class, probs, logits) = reference(model, pixels);
    assert_eq!(got["class"].as_u64(), Some(class as u64), "class of {got}");
    let (p, l) = (floats(&got["probabilities"]), floats(&got["logits"]));
    assert_eq!((p.len(), l.len()), (CLASSES, CLASSES));
    for k in 0..CLASSES {
        assert!(
            (p[k] - probs[k]).abs() <= 1e-5,
            "probability {k}: {} vs {}",
            p[k],
            probs[k]
        );
        assert!(
            (l[k] - logits[k]).abs() <= 1e-4,
            "logit {k}: {} vs {}",
            l[k],
            logits[k]
        );
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_burst_is_batched_and_matches_the_model() {
    const REQUESTS: usize = 200;
    const CLIENTS: usize = 32;
    let dir = TempDir::new("burst");
    let (model, path) = model_and_checkpoint(&dir);
    let mut cfg = config(path);
    cfg.max_batch = 16;
    cfg.max_wait = Duration::from_millis(5);
    let server = start(cfg).await;
    let addr = server.addr;

    let inputs = Arc::new(images(REQUESTS));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (inputs, next) = (Arc::clone(&inputs), Arc::clone(&next));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= REQUESTS {
                        return answers;
                    }
                    let t = Instant::now();
                    let reply = post_json(addr, &json!({ "pixels": inputs[i] })).await;
                    answers.push((i, reply, t.elapsed().as_secs_f64() * 1e3));
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for c in clients {
        answers.extend(c.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(answers.len(), REQUESTS);

    let mut latencies = Vec::new();
    for (i, reply, ms) in &answers {
        assert_eq!(reply.status, 200, "request {i}: {}", reply.body);
        check_prediction(&model, &inputs[*i], &reply.body);
        latencies.push(*ms);
    }
    latencies.sort_by(f64::total_cmp);
    println!(
        "burst: {REQUESTS} requests over {CLIENTS} clients in {secs:.3}s: {:.0} requests/s, \
         latency p50 {:.2} ms p99 {:.2} ms ({} build)",
        REQUESTS as f64 / secs,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );

    let m = get(addr, "/metrics.json").await;
    assert_eq!(m.status, 200);
    let b = &m.body;
    println!("metrics after the burst: {b}");
    assert_eq!(b["requests_served"], REQUESTS);
    assert_eq!(b["images_served"], REQUESTS);
    assert_eq!(b["requests_in_flight"], 0);
    assert_eq!(b["errors"], json!({}));
    let batches = b["batches_run"].as_u64().unwrap();
    assert!(batches >= 1 && batches <= REQUESTS as u64);
    // 32 clients against one batcher: some batches must hold several requests.
    assert!(
        b["multi_request_batches"].as_u64().unwrap() > 0,
        "no batch served more than one request: {b}"
    );
    assert!(b["largest_batch"].as_u64().unwrap() > 1);
    assert!(b["largest_batch"].as_u64().unwrap() <= 16);
    let mean = b["mean_batch_size"].as_f64().unwrap();
    assert!((mean - REQUESTS as f64 / batches as f64).abs() < 1e-9);
    assert_eq!(b["latency_ms"]["samples"], REQUESTS);
    let (p50, p99) = (
        b["latency_ms"]["p50"].as_f64().unwrap(),
        b["latency_ms"]["p99"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "p50 {p50} p99 {p99}");
    println!("server-side latency p50 {p50:.2} ms p99 {p99:.2} ms, mean batch {mean:.2}");

    // The same counters in Prometheus's text format.
    let p = prometheus(addr).await;
    let n = REQUESTS as f64;
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_requests_total{route="/predict",status="200"}"#
        ),
        n
    );
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_requests_total{route="/metrics.json",status="200"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_request_duration_seconds_count{route="/predict"}"#
        ),
        n
    );
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_request_duration_seconds_bucket{route="/predict",le="+Inf"}"#
        ),
        n
    );
    assert_eq!(sample(&p, "forma_serve_predictions_total"), n);
    assert_eq!(sample(&p, "forma_serve_images_total"), n);
    assert_eq!(sample(&p, "forma_serve_requests_in_flight"), 0.0);
    assert!(
        !p.keys().any(|k| k.starts_with("forma_serve_errors_total")),
        "{p:?}"
    );
    let batches = batches as f64;
    assert_eq!(sample(&p, "forma_serve_batch_images_count"), batches);
    assert_eq!(sample(&p, "forma_serve_batch_images_sum"), n);
    assert_eq!(
        sample(&p, r#"forma_serve_batch_images_bucket{le="16"}"#),
        batches
    );
    assert_eq!(
        sample(&p, r#"forma_serve_batch_images_bucket{le="+Inf"}"#),
        batches
    );
    // Some batches held more than one image, so not all fit `le="1"`.
    assert!(sample(&p, r#"forma_serve_batch_images_bucket{le="1"}"#) < batches);
    assert_eq!(sample(&p, "forma_serve_batch_requests_sum"), n);
    assert_eq!(
        sample(&p, "forma_serve_multi_request_batches_total"),
        b["multi_request_batches"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&p, "forma_serve_largest_batch_images"),
        b["largest_batch"].as_f64().unwrap()
    );
    assert_eq!(
        sample(&p, "forma_serve_prediction_latency_seconds_count"),
        n
    );
    let q50 = sample(
        &p,
        r#"forma_serve_prediction_latency_seconds{quantile="0.5"}"#,
    );
    assert!((q50 * 1e3 - p50).abs() < 1e-9, "{q50} s vs {p50} ms");
    let sum = sample(&p, "forma_serve_prediction_latency_seconds_sum");
    assert!(sum >= q50 * n / 2.0, "latency sum {sum}");

    // The batch form: one request, several images, answered in order.
    let five: Vec<&Vec<f32>> = inputs.iter().take(5).collect();
    let r = post_json(addr, &json!({ "batch": five })).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let preds = r.body["predictions"].as_array().unwrap();
    assert_eq!(preds.len(), 5);
    for (p, x) in preds.iter().zip(&five) {
        check_prediction(&model, x, p);
    }

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_json_errors() {
    const LIMIT: usize = 64 * 1024;
    let dir = TempDir::new("malformed");
    let (model, path) = model_and_checkpoint(&dir);
    let mut cfg = config(path);
    cfg.body_limit = LIMIT;
    cfg.max_batch = 4;
    let server = start(cfg).await;
    let addr = server.addr;
    let good = images(1).remove(0);
    let good_json = json!({ "pixels": good }).to_string();

    let mut short = good.clone();
    short.pop();
    let with = |i: usize, v: &str| {
        let mut parts: Vec<String> = good.iter().map(|p| p.to_string()).collect();
        parts[i] = v.to_string();
        format!("{{\"pixels\": [{}]}}", parts.join(","))
    };
    let json = Some("application/json");
    let cases: Vec<(&str, Reply, u16, &str, &str)> = vec![
        (
            "text/plain",
            post(addr, Some("text/plain"), &good_json).await,
            415,
            "content_type",
            "Content-Type: application/json",
        ),
        (
            "no content type",
            post(addr, None, &good_json).await,
            415,
            "content_type",
            "Content-Type: application/json",
        ),
        (
            "truncated JSON",
            post(addr, json, &good_json[..100]).await,
            400,
            "bad_json",
            "parse",
        ),
        (
            "not JSON",
            post(addr, json, "pixels=1,2,3").await,
            400,
            "bad_json",
            "parse",
        ),
        (
            "a string pixel",
            post(addr, json, &with(3, "\"a\"")).await,
            422,
            "bad_field",
            "invalid type: string \"a\", expected f32",
        ),
        (
            "a null pixel",
            post(addr, json, &with(0, "null")).await,
            422,
            "bad_field",
            "invalid type: null",
        ),
        (
            "pixels not a list",
            post_json(addr, &json!({ "pixels": 0.5 })).await,
            422,
            "bad_field",
            "expected a sequence",
        ),
        (
            "an unknown field",
            post_json(addr, &json!({ "pixel": good })).await,
            422,
            "bad_field",
            "unknown field `pixel`",
        ),
        (
            "no field",
            post_json(addr, &json!({})).await,
            422,
            "missing_field",
            "missing field `pixels`",
        ),
        (
            "both fields",
            post_json(addr, &json!({ "pixels": good, "batch": [good] })).await,
            422,
            "ambiguous",
            "not both",
        ),
        (
            "783 pixels",
            post_json(addr, &json!({ "pixels": short })).await,
            422,
            "wrong_length",
            "`pixels` has 783 values; an image is 784",
        ),
        (
            "a short image in a batch",
            post_json(addr, &json!({ "batch": [good, short] })).await,
            422,
            "wrong_length",
            "`batch[1]` has 783 values",
        ),
        (
            "an infinite pixel",
            post(addr, json, &with(5, "1e39")).await,
            422,
            "non_finite",
            "`pixels[5]` is inf",
        ),
        (
            "a pixel above 1",
            post(addr, json, &with(7, "1.5")).await,
            422,
            "out_of_range",
            "`pixels[7]` is 1.5; pixels are in 0..=1",
        ),
        (
            "a negative pixel",
            post(addr, json, &with(8, "-0.25")).await,
            422,
            "out_of_range",
            "`pixels[8]` is -0.25",
        ),
        (
            "an empty batch",
            post_json(addr, &json!({ "batch": [] })).await,
            422,
            "empty_batch",
            "no images",
        ),
        (
            "a batch over --max-batch",
            post_json(addr, &json!({ "batch": vec![&good; 5] })).await,
            422,
            "batch_too_large",
            "`batch` has 5 images; at most 4",
        ),
        (
            // Refused on the header alone: the body is never sent.
            "a declared body over the limit",
            exchange(
                addr,
                &format!(
                    "POST /predict HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
                    LIMIT + 1
                ),
                b"",
            )
            .await
            .unwrap(),
            413,
            "body_too_large",
            "the limit is 65536",
        ),
        (
            "GET /predict",
            get(addr, "/predict").await,
            405,
            "method_not_allowed",
            "/predict does not take GET",
        ),
        (
            "an unknown route",
            get(addr, "/nope").await,
            404,
            "not_found",
            "no route /nope",
        ),
    ];
    let mut expected_counts = std::collections::BTreeMap::<&str, u64>::new();
    for (what, reply, status, kind, message) in &cases {
        assert_eq!(reply.status, *status, "{what}: {}", reply.body);
        assert_eq!(reply.body["kind"], *kind, "{what}: {}", reply.body);
        let error = reply.body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(message),
            "{what}: message {error:?} lacks {message:?}"
        );
        *expected_counts.entry(*kind).or_default() += 1;
    }

    // A chunked body (no Content-Length) over the limit: caught while read.
    let big = format!("{{\"pixels\": [{}]}}", vec!["0.123456789"; 8000].join(","));
    assert!(big.len() > LIMIT);
    let mut chunked = format!("{:x}\r\n", big.len()).into_bytes();
    chunked.extend_from_slice(big.as_bytes());
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let r = exchange(
        addr,
        "POST /predict HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked",
        &chunked,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.body["kind"], "body_too_large");
    *expected_counts.entry("body_too_large").or_default() += 1;

    // Nothing above hurt the batcher: a valid request is still answered.
    let r = post(addr, json, &good_json).await;
    assert_eq!(r.status, 200, "{}", r.body);
    check_prediction(&model, &good, &r.body);

    let m = get(addr, "/metrics.json").await.body;
    assert_eq!(m["requests_served"], 1);
    assert_eq!(
        m["batches_run"], 1,
        "only the valid request reached the model"
    );
    let counted: std::collections::BTreeMap<String, u64> =
        serde_json::from_value(m["errors"].clone()).unwrap();
    let expected: std::collections::BTreeMap<String, u64> = expected_counts
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    assert_eq!(counted, expected);

    // In Prometheus's format: the same errors by kind, and every answer by
    // route and status (unknown paths under `other`).
    let p = prometheus(addr).await;
    for (kind, n) in &expected {
        assert_eq!(
            sample(&p, &format!("forma_serve_errors_total{{kind=\"{kind}\"}}")),
            *n as f64
        );
    }
    let mut by_route = BTreeMap::<(&str, u16), f64>::new();
    for (what, _, status, _, _) in &cases {
        let route = if *what == "an unknown route" {
            "other"
        } else {
            "/predict"
        };
        *by_route.entry((route, *status)).or_default() += 1.0;
    }
    *by_route.entry(("/predict", 413)).or_default() += 1.0; // chunked
    *by_route.entry(("/predict", 200)).or_default() += 1.0; // the valid one
    *by_route.entry(("/metrics.json", 200)).or_default() += 1.0;
    let counted: BTreeMap<(&str, u16), f64> = p
        .iter()
        .filter_map(|(k, v)| {
            let labels = k.strip_prefix("forma_serve_http_requests_total{route=\"")?;
            let (route, status) = labels.strip_suffix("\"}")?.split_once("\",status=\"")?;
            let route = ["/predict", "/metrics.json", "/health", "/metrics", "other"]
                .into_iter()
                .find(|r| *r == route)
                .unwrap_or_else(|| panic!("an unexpected route label in {k}"));
            Some(((route, status.parse().unwrap()), *v))
        })
        .collect();
    assert_eq!(counted, by_route);
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_request_duration_seconds_count{route="other"}"#
        ),
        1.0
    );
    assert_eq!(sample(&p, "forma_serve_batch_images_count"), 1.0);

    let h = get(addr, "/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.body["status"], "ok");
    assert_eq!(h.body["parameters"], model.num_parameters());
    assert_eq!(h.body["max_batch"], 4);
    assert!(h.body["checkpoint"]
        .as_str()
        .unwrap()
        .ends_with("model.safetensors"));

    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_checkpoints_stop_startup() {
    let dir = TempDir::new("badckpt");
    let try_serve = |path: PathBuf| async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        // `serve` must fail before it waits for the shutdown signal.
        tokio::time::timeout(
            Duration::from_secs(30),
            serve(listener, config(path), std::future::pending()),
        )
        .await
        .expect("serve started despite a bad checkpoint")
    };

    let missing = dir.0.join("missing.safetensors");
    let err = try_serve(missing).await.unwrap_err();
    assert!(matches!(err, ServeError::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("missing.safetensors"), "{err}");

    let garbage = dir.0.join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a safetensors file").unwrap();
    let err = try_serve(garbage).await.unwrap_err();
    assert!(matches!(err, ServeError::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("garbage.safetensors"), "{err}");

    // A valid checkpoint of another model: strictly refused, naming keys.
    let other = dir.0.join("linear.safetensors");
    LinearModel::new(&mut Rng::seed_from(1))
        .save_safetensors(&other)
        .unwrap();
    let err = try_serve(other).await.unwrap_err();
    assert!(matches!(err, ServeError::Checkpoint(_)), "{err}");
    assert!(err.to_string().contains("conv1.weight"), "{err}");

    // A cut-off copy of a good checkpoint.
    let (_, good) = model_and_checkpoint(&dir);
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.0.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = try_serve(cut).await.unwrap_err();
    assert!(matches!(err, ServeError::Checkpoint(_)), "{err}");

    // And a bad setting is refused before anything is loaded.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = config(good);
    cfg.max_batch = 0;
    let err = serve(listener, cfg, std::future::pending())
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::Config(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_requests_in_flight() {
    const IN_FLIGHT: usize = 6;
    let dir = TempDir::new("shutdown");
    let (model, path) = model_and_checkpoint(&dir);
    let mut cfg = config(path);
    // A long wait holds the requests in the batcher while shutdown starts.
    cfg.max_wait = Duration::from_millis(400);
    cfg.max_batch = 64;
    let server = start(cfg).await;
    let addr = server.addr;
    let inputs = images(IN_FLIGHT);

    let pending: Vec<_> = inputs
        .iter()
        .map(|x| {
            let body = json!({ "pixels": x });
            tokio::spawn(async move { post_json(addr, &body).await })
        })
        .collect();
    // Wait until the service holds every request.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = get(addr, "/metrics.json").await.body;
        if m["requests_in_flight"] == IN_FLIGHT {
            break;
        }
        assert!(Instant::now() < deadline, "requests never arrived: {m}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    server.shutdown().await;
    for (p, x) in pending.into_iter().zip(&inputs) {
        let r = p.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        check_prediction(&model, x, &r.body);
    }
    // The listener is closed: nothing is accepted any more.
    assert!(
        TcpStream::connect(addr).await.is_err()
            || exchange(addr, "GET /health HTTP/1.1", b"").await.is_err(),
        "the service still answers after shutdown"
    );
}

/// Reads until the server closes the connection (or `limit` passes: then
/// the test fails) and returns what came and when it closed.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut raw = Vec::new();
    let read = tokio::time::timeout(limit, s.read_to_end(&mut raw)).await;
    assert!(
        read.is_ok(),
        "the server kept the connection open past {limit:?}"
    );
    (
        String::from_utf8_lossy(&raw).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_clients_are_timed_out() {
    let dir = TempDir::new("timeouts");
    let (_, path) = model_and_checkpoint(&dir);
    let mut cfg = config(path);
    cfg.header_timeout = Duration::from_millis(300);
    cfg.body_timeout = Duration::from_millis(300);
    let server = start(cfg).await;
    let addr = server.addr;
    let limit = Duration::from_secs(10);

    // Connects and sends nothing.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (got, _) = until_closed(&mut silent, limit).await;
    assert!(!got.contains("200"), "{got}");

    // Half a request line.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /predict HTT").await.unwrap();
    until_closed(&mut half, limit).await;

    // Headers, then 10 of the 100 body bytes promised.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /predict HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"pixels\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let (got, _) = until_closed(&mut slow, limit).await;
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"kind\":\"body_timeout\""), "{got}");

    // A kept-alive connection, idle after its answer, is closed.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    idle.write_all(req.as_bytes()).await.unwrap();
    let (got, _) = until_closed(&mut idle, limit).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");

    // The service still answers well-behaved clients, and counted the 408.
    let m = get(addr, "/metrics.json").await.body;
    assert_eq!(m["errors"]["body_timeout"], 1, "{m}");
    server.shutdown().await;
}

/// The binary, sent SIGTERM while a client holds half a request open,
/// stops within its shutdown grace period.
#[cfg(unix)]
/// The address a `forma-serve` child prints on its stdout (`... http://ADDR ...`),
/// with the rest of its stdout, to keep open while the child runs.
fn printed_addr(
    child: &mut std::process::Child,
) -> (
    SocketAddr,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .unwrap();
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
    };
    (addr, lines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_half_sent_request_stops_within_the_grace() {
    let dir = TempDir::new("sigterm");
    let (_, path) = model_and_checkpoint(&dir);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_forma-serve"))
        .args([
            "--checkpoint",
            path.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .args(["--header-timeout-ms", "60000", "--shutdown-grace-ms", "500"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _stdout) = printed_addr(&mut child);
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Le")
        .await
        .unwrap();
    // Let the server take the connection before the signal.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = sent + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server did not stop within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = sent.elapsed();
    assert!(status.success(), "{status}");
    // The grace is 500 ms; the rest is the process's own teardown.
    assert!(took < Duration::from_secs(5), "{took:?}");
    let (got, _) = until_closed(&mut half, Duration::from_secs(5)).await;
    assert!(!got.contains("200"), "{got}");
}

/// With one connection allowed, a second client is served only once the
/// first one has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_one() {
    let dir = TempDir::new("cap");
    let (_, path) = model_and_checkpoint(&dir);
    let mut cfg = config(path);
    cfg.max_connections = 1;
    let server = start(cfg).await;
    let addr = server.addr;
    let holder = TcpStream::connect(addr).await.unwrap();
    // Let the server take the first connection.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let waiting = tokio::spawn(async move { get(addr, "/health").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the second client was served at once"
    );
    drop(holder);
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once the first connection closed")
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(500));
    server.shutdown().await;
}

/// Writes MNIST's test files (IDX, uncompressed) holding `labels`, each
/// image a rendered digit; returns the images' bytes.
fn write_mnist_test_set(dir: &std::path::Path, labels: &[u8]) -> Vec<Vec<u8>> {
    let mut rng = Rng::seed_from(5);
    let images: Vec<Vec<u8>> = labels
        .iter()
        .map(|&l| render(l, &mut rng).to_vec())
        .collect();
    let n = labels.len() as u32;
    let mut idx = Vec::new();
    for v in [0x0803, n, 28, 28] {
        idx.extend_from_slice(&u32::to_be_bytes(v));
    }
    idx.extend(images.iter().flatten());
    std::fs::write(dir.join("t10k-images-idx3-ubyte"), idx).unwrap();
    let mut idx = Vec::new();
    for v in [0x0801, n] {
        idx.extend_from_slice(&u32::to_be_bytes(v));
    }
    idx.extend_from_slice(labels);
    std::fs::write(dir.join("t10k-labels-idx1-ubyte"), idx).unwrap();
    images
}

/// The binary with `args`, run to its end: (success, stdout, stderr).
fn run_binary(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forma-serve"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn dump_sample_writes_a_real_digit_or_says_how_to_get_one() {
    let dir = TempDir::new("dump");
    let data = dir.0.join("mnist");
    std::fs::create_dir_all(&data).unwrap();
    let images = write_mnist_test_set(&data, &[7, 2, 1]);
    let out = dir.0.join("sample.json");
    let (ok, _, err) = run_binary(&[
        "--dump-sample",
        out.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--index",
        "1",
    ]);
    assert!(ok, "{err}");
    assert!(err.lines().any(|l| l == "label: 2"), "{err}");
    assert!(err.contains("-d @"), "{err}");
    let body: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let object = body.as_object().unwrap();
    assert_eq!(object.keys().collect::<Vec<_>>(), ["pixels"]);
    let pixels = floats(&body["pixels"]);
    let expected: Vec<f32> = images[1].iter().map(|&b| f32::from(b) / 255.0).collect();
    assert_eq!(pixels, expected);
    assert!(pixels.iter().any(|&p| p > 0.5), "a blank image");

    // Past the last image.
    let (ok, _, err) = run_binary(&[
        "--dump-sample",
        out.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--index",
        "3",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--index 3: the MNIST test set has 3 images"),
        "{err}"
    );

    // No data: the error names the directory and the command that fills it.
    let empty = dir.0.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let none = dir.0.join("none.json");
    let (ok, _, err) = run_binary(&[
        "--dump-sample",
        none.to_str().unwrap(),
        "--data",
        empty.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(err.contains("no MNIST test set in"), "{err}");
    assert!(err.contains("t10k-images-idx3-ubyte"), "{err}");
    assert!(
        err.contains(&format!(
            "cargo run --release -p forma-examples --example train -- --download --cache {}",
            empty.display()
        )),
        "{err}"
    );
    assert!(!none.exists());
}

#[test]
fn a_misspelled_flag_gets_clap_s_suggestion() {
    let (ok, _, err) = run_binary(&["--checkpoint", "m", "--max-bacth", "3"]);
    assert!(!ok);
    assert!(
        err.contains("a similar argument exists: '--max-batch'"),
        "{err}"
    );
    let (ok, help, _) = run_binary(&["--help"]);
    assert!(ok);
    assert!(help.contains("--dump-sample <PATH>"), "{help}");
}

/// The README's first hour: dump a sample, serve, send it with the body
/// file as is, see one log line for it and the counters in `/metrics`.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_a_dumped_sample_and_logs_the_request() {
    use std::io::BufRead;
    let dir = TempDir::new("firsthour");
    let (model, path) = model_and_checkpoint(&dir);
    let images = write_mnist_test_set(&dir.0, &[4, 9]);
    let body_file = dir.0.join("sample.json");
    let (ok, _, err) = run_binary(&[
        "--dump-sample",
        body_file.to_str().unwrap(),
        "--data",
        dir.0.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("label: 4"), "{err}");

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_forma-serve"))
        .args([
            "--checkpoint",
            path.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ])
        .args([
            "--mean",
            &NORM.mean.to_string(),
            "--std",
            &NORM.std.to_string(),
        ])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (addr, _stdout) = printed_addr(&mut child);
    let (log_tx, logs) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            if log_tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });

    let body = std::fs::read_to_string(&body_file).unwrap();
    let r = post(addr, Some("application/json"), &body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let pixels: Vec<f32> = images[0].iter().map(|&b| f32::from(b) / 255.0).collect();
    check_prediction(&model, &pixels, &r.body);

    let line = loop {
        let line = logs
            .recv_timeout(Duration::from_secs(10))
            .expect("a log line for the request");
        if line.contains("/predict") {
            break line;
        }
    };
    for field in [
        "INFO",
        "method=POST",
        "/predict",
        "status=200",
        "latency_ms=",
        "images=1",
    ] {
        assert!(line.contains(field), "{field} missing in {line:?}");
    }

    let p = prometheus(addr).await;
    assert_eq!(sample(&p, "forma_serve_predictions_total"), 1.0);
    assert_eq!(
        sample(
            &p,
            r#"forma_serve_http_requests_total{route="/predict",status="200"}"#
        ),
        1.0
    );
    let line = logs
        .recv_timeout(Duration::from_secs(10))
        .expect("a log line for /metrics");
    assert!(
        line.contains("path=/metrics") || line.contains("\"/metrics\""),
        "{line}"
    );

    let _ = child.kill();
    let _ = child.wait();
}
