//! `--download` against a hand-written HTTP/1.1 server on 127.0.0.1: good
//! files land in the cache and read as IDX, a corrupted file, a 404 and a
//! connection closed mid-body leave nothing under a final name, and a
//! filled cache is used without a request.

use flate2::write::GzEncoder;
use flate2::Compression;
use forma::nn::data::{read_idx_images, Mnist, MnistSplit};
use forma_examples::download::{Download, DownloadError, RemoteFile, Source};
use forma_examples::train::{run, Args, DeviceArg, ModelKind, TrainError};
use md5::{Digest, Md5};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What the server answers for a path.
#[derive(Clone)]
enum Reply {
    /// 200 with these bytes.
    Body(Vec<u8>),
    /// 200 announcing the whole length, but only the first `n` bytes sent
    /// before the connection closes.
    Cut(Vec<u8>, usize),
}

/// A server answering one request per connection; anything not in the
/// routes is a 404. Counts requests and records their paths.
struct Server {
    base: String,
    requests: Arc<AtomicUsize>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(routes: HashMap<String, Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let base = format!("http://{}/mnist/", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let paths = Arc::new(Mutex::new(Vec::new()));
        let (count, log) = (Arc::clone(&requests), Arc::clone(&paths));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                // Skip the headers up to the blank line.
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" || line == "\n" => break,
                        Ok(_) => {}
                    }
                }
                let path = request_line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("")
                    .to_string();
                count.fetch_add(1, Ordering::SeqCst);
                log.lock().expect("log").push(path.clone());
                let name = path.strip_prefix("/mnist/").unwrap_or("");
                let _ = match routes.get(name) {
                    Some(Reply::Body(body)) => respond(&mut stream, "200 OK", body, body.len()),
                    Some(Reply::Cut(body, n)) => respond(&mut stream, "200 OK", body, *n),
                    None => respond(&mut stream, "404 Not Found", b"no such file\n", 13),
                };
                // Dropping the stream closes the connection.
            }
        });
        Server {
            base,
            requests,
            paths,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Writes a response announcing `body.len()` bytes and sends the first `send`.
fn respond(
    stream: &mut std::net::TcpStream,
    status: &str,
    body: &[u8],
    send: usize,
) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body[..send])?;
    stream.flush()
}

fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).expect("in memory");
    enc.finish().expect("in memory")
}

/// An IDX3 file of `n` 28x28 images with pixel `(i * 7 + p) % 256`.
fn idx_images(n: usize) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0, 0, 8, 3];
    for d in [n as u32, 28, 28] {
        out.extend_from_slice(&d.to_be_bytes());
    }
    let pixels: Vec<u8> = (0..n * 784).map(|p| ((p / 784) * 7 + p) as u8).collect();
    out.extend_from_slice(&pixels);
    (out, pixels)
}

/// An IDX1 file of `n` labels `(i * 3) % 10`.
fn idx_labels(n: usize) -> (Vec<u8>, Vec<u8>) {
    let mut out = vec![0, 0, 8, 1];
    out.extend_from_slice(&(n as u32).to_be_bytes());
    let labels: Vec<u8> = (0..n).map(|i| ((i * 3) % 10) as u8).collect();
    out.extend_from_slice(&labels);
    (out, labels)
}

/// MNIST's four files, small: `train` and `test` images each.
struct Fixture {
    routes: HashMap<String, Reply>,
    table: Vec<RemoteFile>,
    train_pixels: Vec<u8>,
    train_labels: Vec<u8>,
    test_labels: Vec<u8>,
}

fn mnist_fixture(train: usize, test: usize) -> Fixture {
    let (ti, train_pixels) = idx_images(train);
    let (tl, train_labels) = idx_labels(train);
    let (vi, _) = idx_images(test);
    let (vl, test_labels) = idx_labels(test);
    let mut routes = HashMap::new();
    let mut table = Vec::new();
    for (name, plain) in [
        ("train-images-idx3-ubyte.gz", ti),
        ("train-labels-idx1-ubyte.gz", tl),
        ("t10k-images-idx3-ubyte.gz", vi),
        ("t10k-labels-idx1-ubyte.gz", vl),
    ] {
        let gz = gzip(&plain);
        table.push(RemoteFile::new(name, md5_hex(&gz)));
        routes.insert(name.to_string(), Reply::Body(gz));
    }
    Fixture {
        routes,
        table,
        train_pixels,
        train_labels,
        test_labels,
    }
}

/// A fresh, empty directory.
fn cache_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("forma-download-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The names in `dir`, sorted (hidden temporaries included).
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn good_files_land_in_the_cache_decode_as_idx_and_are_reused_without_requests() {
    let fx = mnist_fixture(5, 3);
    let server = Server::start(fx.routes.clone());
    let dir = cache_dir("good");
    let job = Download::mnist(server.base.trim_end_matches('/'), &dir)
        .files(fx.table.clone())
        .progress(false);

    let first = job.run().expect("all four files are served and match");
    assert_eq!(first.dir, dir);
    let names: Vec<&str> = fx.table.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        first.files,
        names
            .iter()
            .map(|n| (n.to_string(), Source::Fetched))
            .collect::<Vec<_>>()
    );
    assert_eq!(server.requests(), 4);
    assert_eq!(
        *server.paths.lock().expect("log"),
        names
            .iter()
            .map(|n| format!("/mnist/{n}"))
            .collect::<Vec<_>>()
    );
    // The .gz files and their decompressed IDX files, nothing else.
    let mut expected: Vec<String> = names
        .iter()
        .flat_map(|n| [n.to_string(), n.trim_end_matches(".gz").to_string()])
        .collect();
    expected.sort();
    assert_eq!(listing(&dir), expected);

    // What `--data DIR` reads.
    let images = read_idx_images(dir.join("train-images-idx3-ubyte")).expect("plain IDX");
    assert_eq!((images.count, images.rows, images.cols), (5, 28, 28));
    assert_eq!(images.data, fx.train_pixels);
    let train =
        Mnist::<(forma::C<1>, forma::C<28>, forma::C<28>)>::from_dir(&dir, MnistSplit::Train)
            .expect("train split");
    assert_eq!(train.labels(), fx.train_labels.as_slice());
    assert_eq!(train.pixels(4), Some(&fx.train_pixels[4 * 784..5 * 784]));
    let test = Mnist::<(forma::C<1>, forma::C<28>, forma::C<28>)>::from_dir(&dir, MnistSplit::Test)
        .expect("test split");
    assert_eq!(test.labels(), [0, 3, 6]);
    assert_eq!(test.labels(), fx.test_labels.as_slice());

    // Second run: everything cached, no request.
    let second = job.run().expect("cached");
    assert!(second.files.iter().all(|(_, s)| *s == Source::Cached));
    assert_eq!(server.requests(), 4, "a filled cache makes no request");

    // A cached file that no longer matches its digest is fetched again.
    let labels_gz = dir.join("train-labels-idx1-ubyte.gz");
    let mut bytes = std::fs::read(&labels_gz).expect("cached");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&labels_gz, &bytes).expect("rewrite");
    std::fs::remove_file(dir.join("train-images-idx3-ubyte")).expect("remove one IDX");
    let third = job.run().expect("re-fetched");
    assert_eq!(
        third.files.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [
            Source::Cached,
            Source::Fetched,
            Source::Cached,
            Source::Cached
        ]
    );
    assert_eq!(server.requests(), 5);
    assert_eq!(
        server.paths.lock().expect("log").last().map(String::as_str),
        Some("/mnist/train-labels-idx1-ubyte.gz")
    );
    // The removed IDX file was decompressed again from its cached .gz.
    assert_eq!(
        read_idx_images(dir.join("train-images-idx3-ubyte"))
            .expect("restored")
            .data,
        fx.train_pixels
    );
    assert_eq!(listing(&dir), expected);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn the_digest_is_md5_of_the_bytes() {
    // RFC 1321's test vector: MD5("abc").
    let mut routes = HashMap::new();
    routes.insert("abc".to_string(), Reply::Body(b"abc".to_vec()));
    let server = Server::start(routes);
    let dir = cache_dir("abc");
    let report = Download::mnist(&server.base, &dir)
        .files(vec![RemoteFile::new(
            "abc",
            "900150983CD24FB0D6963F7D28E17F72",
        )])
        .progress(false)
        .run()
        .expect("matches");
    assert_eq!(report.files, [("abc".to_string(), Source::Fetched)]);
    assert_eq!(std::fs::read(dir.join("abc")).expect("saved"), b"abc");
    assert_eq!(listing(&dir), ["abc"]);
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_corrupted_file_is_rejected_and_leaves_no_file() {
    let fx = mnist_fixture(2, 2);
    let mut routes = fx.routes.clone();
    // The server's copy differs from the one the digest was taken of.
    let name = "t10k-images-idx3-ubyte.gz";
    let Some(Reply::Body(good)) = routes.get(name).cloned() else {
        unreachable!("the fixture has it")
    };
    let mut bad = good.clone();
    bad[20] ^= 0x01;
    routes.insert(name.to_string(), Reply::Body(bad.clone()));
    let server = Server::start(routes);
    let dir = cache_dir("corrupt");
    let err = Download::mnist(&server.base, &dir)
        .files(fx.table.clone())
        .progress(false)
        .run()
        .expect_err("a digest mismatch");
    match &err {
        DownloadError::Checksum {
            file,
            expected,
            actual,
        } => {
            assert_eq!(file, name);
            assert_eq!(*expected, md5_hex(&good));
            assert_eq!(*actual, md5_hex(&bad));
            assert_ne!(expected, actual);
        }
        e => panic!("expected a checksum error, got {e:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(name) && msg.contains(&md5_hex(&bad)), "{msg}");
    // The two files before it were verified and kept; nothing of the bad
    // one, under its final name or a temporary one.
    assert_eq!(
        listing(&dir),
        [
            "train-images-idx3-ubyte",
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte",
            "train-labels-idx1-ubyte.gz"
        ]
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_404_is_an_http_status_error() {
    let server = Server::start(HashMap::new());
    let dir = cache_dir("404");
    let err = Download::mnist(&server.base, &dir)
        .progress(false)
        .run()
        .expect_err("nothing is served");
    match &err {
        DownloadError::Status { url, status } => {
            assert_eq!(*status, 404);
            assert_eq!(*url, format!("{}train-images-idx3-ubyte.gz", server.base));
        }
        e => panic!("expected a status error, got {e:?}"),
    }
    assert!(err.to_string().ends_with("HTTP status 404"), "{err}");
    assert_eq!(server.requests(), 1, "the first failure stops the job");
    assert_eq!(listing(&dir), Vec::<String>::new());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_connection_closed_mid_body_leaves_nothing() {
    let fx = mnist_fixture(3, 2);
    let mut routes = HashMap::new();
    let name = "train-images-idx3-ubyte.gz";
    let Some(Reply::Body(body)) = fx.routes.get(name).cloned() else {
        unreachable!("the fixture has it")
    };
    let half = body.len() / 2;
    routes.insert(name.to_string(), Reply::Cut(body.clone(), half));
    let server = Server::start(routes);
    let dir = cache_dir("cut");
    let err = Download::mnist(&server.base, &dir)
        .files(fx.table[..1].to_vec())
        .progress(false)
        .run()
        .expect_err("a short body");
    match &err {
        DownloadError::Truncated {
            received, expected, ..
        } => {
            assert_eq!(*received, half as u64);
            assert_eq!(*expected, body.len() as u64);
        }
        // What ureq reports: the peer closed before `Content-Length` bytes.
        DownloadError::Transfer {
            received, source, ..
        } => {
            assert!(*received <= half as u64, "{received} > {half}");
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
        }
        e => panic!("expected a truncated transfer, got {e:?}"),
    }
    assert_eq!(listing(&dir), Vec::<String>::new());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_malformed_table_entry_is_refused_before_any_request() {
    let server = Server::start(HashMap::new());
    let dir = cache_dir("table");
    for (name, md5, reason) in [
        ("a.gz", "1234", "the md5 digest must be 32 hex digits"),
        (
            "../a.gz",
            "900150983cd24fb0d6963f7d28e17f72",
            "the name must be a plain file name",
        ),
    ] {
        match Download::mnist(&server.base, &dir)
            .files(vec![RemoteFile::new(name, md5)])
            .run()
        {
            Err(DownloadError::BadEntry { name: n, reason: r }) => {
                assert_eq!((n.as_str(), r), (name, reason));
            }
            other => panic!("expected a bad entry error, got {other:?}"),
        }
    }
    assert_eq!(server.requests(), 0);
}

#[test]
fn the_training_example_trains_on_a_download() {
    let fx = mnist_fixture(96, 32);
    let server = Server::start(fx.routes.clone());
    let cache = cache_dir("train-cache");
    let out = cache_dir("train-out");
    let args = Args {
        download: true,
        mirror: server.base.clone(),
        cache: cache.clone(),
        out: out.clone(),
        epochs: Some(1),
        batch_size: Some(32),
        model: Some(ModelKind::Linear),
        progress: false,
        ..Args::default()
    };
    // The fixture's digests stand in for MNIST's: point the job at them by
    // filling the cache first, as a previous `--download` would have.
    Download::mnist(&server.base, &cache)
        .files(fx.table.clone())
        .progress(false)
        .run()
        .expect("fixture served");
    assert_eq!(server.requests(), 4);
    // MNIST's real digests do not match the fixture, so `run` fetches each
    // file again and rejects it, naming the first.
    match run(&args) {
        Err(TrainError::Download(DownloadError::Checksum { file, .. })) => {
            assert_eq!(file, "train-images-idx3-ubyte.gz");
        }
        other => panic!("expected MNIST's digest to reject the fixture, got {other:?}"),
    }
    assert_eq!(server.requests(), 5);
    // The rejected download did not replace the cached file.
    assert_eq!(
        read_idx_images(cache.join("train-images-idx3-ubyte"))
            .expect("kept")
            .data,
        fx.train_pixels
    );
    // Trained on what the cache holds (what `--download` hands to `--data`).
    let summary = run(&Args {
        download: false,
        data: Some(cache.clone()),
        ..args
    })
    .expect("trains on the cached IDX files");
    assert_eq!(summary.metrics.len(), 1);
    assert!(summary.metrics[0].train_loss.is_finite());

    let _ = std::fs::remove_dir_all(&cache);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn cuda_without_the_backend_is_a_clear_error() {
    let out = cache_dir("cuda");
    let err = run(&Args {
        device: DeviceArg::Cuda(1),
        out: out.clone(),
        ..Args::default()
    })
    .expect_err("no CUDA backend in the training example yet");
    let msg = err.to_string();
    assert!(msg.starts_with("device cuda:1: "), "{msg}");
    assert!(
        msg.contains("`cuda` feature") || msg.contains("CUDA backend"),
        "{msg}"
    );
    assert!(
        !out.exists(),
        "nothing is written before the device is known"
    );
}
