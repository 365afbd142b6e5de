//! Downloads MNIST (`--download` in the training example): the four `.gz`
//! files from a mirror into a cache directory, each checked against a known
//! digest, then decompressed into the IDX files that `--data DIR` reads.
//!
//! Nothing unverified ever sits under a final name: a file is written to a
//! temporary name beside its destination, flushed, checked, and only then
//! renamed (atomic on one file system). A cached `.gz` that no longer
//! matches its digest is fetched again; a fresh download that does not
//! match is an error naming the file and both digests. A second run with
//! the cache filled makes no request at all.
//!
//! The digests are the MD5s that torchvision's `MNIST` dataset checks
//! ([`MNIST_FILES`]); MD5 guards against truncated and corrupted transfers,
//! which is all a public dataset needs. The table is a parameter
//! ([`Download::files`]), so tests and other MNIST-format datasets
//! (Fashion-MNIST, KMNIST) bring their own.

use flate2::read::GzDecoder;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use md5::{Digest, Md5};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default mirror: the copy PyTorch's CI and torchvision download from.
pub const DEFAULT_MIRROR: &str = "https://ossci-datasets.s3.amazonaws.com/mnist/";

/// MNIST's four files and their MD5 digests, as `torchvision.datasets.MNIST`
/// lists them.
pub const MNIST_FILES: [(&str, &str); 4] = [
    (
        "train-images-idx3-ubyte.gz",
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    ),
    (
        "train-labels-idx1-ubyte.gz",
        "d53e105ee54ea40749a09fcbcd1e9432",
    ),
    (
        "t10k-images-idx3-ubyte.gz",
        "9fb629c4189551a2d022fa330f9573f3",
    ),
    (
        "t10k-labels-idx1-ubyte.gz",
        "ec29112dd5afa0611ce80d1b7f02629c",
    ),
];

/// One file to fetch: its name on the mirror (and in the cache) and the MD5
/// digest of its bytes, as 32 lowercase or uppercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// The file name, appended to the mirror's URL. A name ending in `.gz`
    /// is also decompressed into the same name without the suffix.
    pub name: String,
    /// The expected MD5 of the file's bytes, in hex.
    pub md5: String,
}

impl RemoteFile {
    /// A file and its digest.
    pub fn new(name: impl Into<String>, md5: impl Into<String>) -> Self {
        RemoteFile {
            name: name.into(),
            md5: md5.into(),
        }
    }
}

/// Why a download failed. Every variant names the file or URL involved.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The bytes do not have the expected digest.
    #[error("{file}: checksum mismatch: expected md5 {expected}, got {actual}")]
    Checksum {
        /// The file name.
        file: String,
        /// The digest in the table.
        expected: String,
        /// The digest of the bytes received.
        actual: String,
    },
    /// The server answered with an error status (404, 500, ...).
    #[error("{url}: HTTP status {status}")]
    Status {
        /// The URL requested.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The request failed before a response: no connection, DNS, TLS, a
    /// malformed response.
    #[error("{url}: {source}")]
    Http {
        /// The URL requested.
        url: String,
        /// What the HTTP client reported.
        source: Box<ureq::Error>,
    },
    /// The connection failed while the body was being received.
    #[error("{url}: transfer failed after {received} bytes: {source}")]
    Transfer {
        /// The URL requested.
        url: String,
        /// Bytes received before the failure.
        received: u64,
        /// The I/O error.
        source: io::Error,
    },
    /// The body ended before the length the server announced.
    #[error("{url}: the connection closed after {received} of {expected} bytes")]
    Truncated {
        /// The URL requested.
        url: String,
        /// Bytes received.
        received: u64,
        /// The announced `Content-Length`.
        expected: u64,
    },
    /// A verified `.gz` file does not decompress.
    #[error("{}: not a valid gzip file: {source}", path.display())]
    Decompress {
        /// The compressed file.
        path: PathBuf,
        /// The decoder's error.
        source: io::Error,
    },
    /// A table entry's digest is not 32 hex digits, or its name is not a
    /// plain file name.
    #[error("`{name}`: {reason}")]
    BadEntry {
        /// The entry's file name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Reading or writing a local file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

/// Where a file came from in a [`Download::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Already in the cache, digest verified: no request made.
    Cached,
    /// Fetched from the mirror (absent from the cache, or cached but no
    /// longer matching its digest).
    Fetched,
}

/// What a finished [`Download::run`] did, one entry per file in table order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The cache directory: pass it to `--data`.
    pub dir: PathBuf,
    /// Each file's name and where it came from.
    pub files: Vec<(String, Source)>,
}

/// The default cache: `$XDG_CACHE_HOME/forma/mnist`, else
/// `$HOME/.cache/forma/mnist`, else `runs/data/mnist`.
pub fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        });
    match base {
        Some(b) => b.join("forma").join("mnist"),
        None => PathBuf::from("runs/data/mnist"),
    }
}

/// A download job: a mirror, a cache directory and a table of files.
///
/// ```no_run
/// use forma_examples::download::{default_cache_dir, Download, DEFAULT_MIRROR};
///
/// let report = Download::mnist(DEFAULT_MIRROR, default_cache_dir()).run()?;
/// // report.dir now holds train-images-idx3-ubyte and the other IDX files.
/// # Ok::<(), forma_examples::download::DownloadError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Download {
    mirror: String,
    cache: PathBuf,
    files: Vec<RemoteFile>,
    progress: bool,
}

impl Download {
    /// MNIST's four files ([`MNIST_FILES`]) from `mirror` (a URL; a missing
    /// final `/` is added) into `cache`.
    pub fn mnist(mirror: impl Into<String>, cache: impl Into<PathBuf>) -> Self {
        let mut mirror = mirror.into();
        if !mirror.ends_with('/') {
            mirror.push('/');
        }
        Download {
            mirror,
            cache: cache.into(),
            files: MNIST_FILES
                .iter()
                .map(|&(n, d)| RemoteFile::new(n, d))
                .collect(),
            progress: true,
        }
    }

    /// Replaces the table of files and digests.
    pub fn files(mut self, files: Vec<RemoteFile>) -> Self {
        self.files = files;
        self
    }

    /// Whether to draw a progress bar per file (default on; indicatif hides
    /// it anyway when stderr is not a terminal). A line per file is printed
    /// either way.
    pub fn progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// Fetches what the cache lacks, verifies everything, decompresses the
    /// `.gz` files, and reports where each file came from.
    ///
    /// # Errors
    /// The first [`DownloadError`] met; files verified before it stay in the
    /// cache, the failing one leaves nothing under its final name.
    pub fn run(&self) -> Result<Report, DownloadError> {
        for f in &self.files {
            check_entry(f)?;
        }
        std::fs::create_dir_all(&self.cache).map_err(|source| DownloadError::Io {
            path: self.cache.clone(),
            source,
        })?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("forma-examples/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let mut files = Vec::with_capacity(self.files.len());
        for f in &self.files {
            let dest = self.cache.join(&f.name);
            let expected = f.md5.to_ascii_lowercase();
            let cached = match md5_of_file(&dest) {
                Ok(actual) if actual == expected => true,
                Ok(actual) => {
                    println!(
                        "{}: cached copy has md5 {actual}, expected {expected}: fetching it again",
                        f.name
                    );
                    false
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(source) => return Err(DownloadError::Io { path: dest, source }),
            };
            let source = if cached {
                println!("{}: cached in {}, md5 ok", f.name, self.cache.display());
                Source::Cached
            } else {
                let url = format!("{}{}", self.mirror, f.name);
                let bytes = self.fetch(&agent, &url, &dest, &f.name, &expected)?;
                println!("{}: downloaded {}, md5 ok", f.name, human_bytes(bytes));
                Source::Fetched
            };
            if let Some(plain) = f.name.strip_suffix(".gz") {
                let plain = self.cache.join(plain);
                if source == Source::Fetched || !plain.exists() {
                    gunzip(&dest, &plain)?;
                }
            }
            files.push((f.name.clone(), source));
        }
        Ok(Report {
            dir: self.cache.clone(),
            files,
        })
    }

    /// Streams `url` into a temporary file beside `dest`, hashing as it
    /// goes, and renames it to `dest` once the digest matches. Returns the
    /// byte count.
    fn fetch(
        &self,
        agent: &ureq::Agent,
        url: &str,
        dest: &Path,
        name: &str,
        expected: &str,
    ) -> Result<u64, DownloadError> {
        let mut response = agent.get(url).call().map_err(|e| match e {
            ureq::Error::StatusCode(status) => DownloadError::Status {
                url: url.to_string(),
                status,
            },
            e => DownloadError::Http {
                url: url.to_string(),
                source: Box::new(e),
            },
        })?;
        let length = response.body().content_length();
        let bar = if self.progress {
            ProgressBar::new(length.unwrap_or(0))
        } else {
            ProgressBar::with_draw_target(length, ProgressDrawTarget::hidden())
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(name.to_string());

        let part = Partial::create(dest)?;
        let mut out = BufWriter::new(&part.file);
        let mut hasher = Md5::new();
        let mut reader = response.body_mut().as_reader();
        let mut buf = vec![0u8; 64 * 1024];
        let mut received = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    bar.abandon();
                    return Err(DownloadError::Transfer {
                        url: url.to_string(),
                        received,
                        source,
                    });
                }
            };
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|source| part.io(source))?;
            received += n as u64;
            bar.set_position(received);
        }
        bar.finish_and_clear();
        if let Some(expected_len) = length.filter(|&l| l != received) {
            return Err(DownloadError::Truncated {
                url: url.to_string(),
                received,
                expected: expected_len,
            });
        }
        out.flush().map_err(|source| part.io(source))?;
        drop(out);
        let actual = hex(&hasher.finalize());
        if actual != expected {
            return Err(DownloadError::Checksum {
                file: name.to_string(),
                expected: expected.to_string(),
                actual,
            });
        }
        part.commit()?;
        Ok(received)
    }
}

/// A file being written under a temporary name; removed on drop unless
/// [`Partial::commit`] renamed it to its destination.
struct Partial {
    file: File,
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl Partial {
    fn create(dest: &Path) -> Result<Self, DownloadError> {
        let name = dest
            .file_name()
            .map_or_else(|| "download".into(), |n| n.to_string_lossy().into_owned());
        let tmp = dest.with_file_name(format!(".{name}.part-{}", std::process::id()));
        let file = File::create(&tmp).map_err(|source| DownloadError::Io {
            path: tmp.clone(),
            source,
        })?;
        Ok(Partial {
            file,
            tmp,
            dest: dest.to_path_buf(),
            done: false,
        })
    }

    fn io(&self, source: io::Error) -> DownloadError {
        DownloadError::Io {
            path: self.tmp.clone(),
            source,
        }
    }

    /// Flushes the data to disk and renames the file into place.
    fn commit(mut self) -> Result<(), DownloadError> {
        self.file.sync_all().map_err(|source| self.io(source))?;
        std::fs::rename(&self.tmp, &self.dest).map_err(|source| DownloadError::Io {
            path: self.dest.clone(),
            source,
        })?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            // Best effort: the error being returned matters more than a
            // leftover temporary file, which never carries a final name.
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Decompresses `gz` into `plain` through a temporary file.
fn gunzip(gz: &Path, plain: &Path) -> Result<(), DownloadError> {
    let input = File::open(gz).map_err(|source| DownloadError::Io {
        path: gz.to_path_buf(),
        source,
    })?;
    let part = Partial::create(plain)?;
    let mut out = BufWriter::new(&part.file);
    io::copy(&mut GzDecoder::new(io::BufReader::new(input)), &mut out).map_err(|source| {
        DownloadError::Decompress {
            path: gz.to_path_buf(),
            source,
        }
    })?;
    out.flush().map_err(|source| part.io(source))?;
    drop(out);
    part.commit()
}

fn check_entry(f: &RemoteFile) -> Result<(), DownloadError> {
    let bad = |reason| DownloadError::BadEntry {
        name: f.name.clone(),
        reason,
    };
    if f.md5.len() != 32 || !f.md5.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad("the md5 digest must be 32 hex digits"));
    }
    let plain = Path::new(&f.name)
        .file_name()
        .is_some_and(|n| n == f.name.as_str());
    if !plain || f.name.starts_with('.') {
        return Err(bad("the name must be a plain file name"));
    }
    Ok(())
}

fn md5_of_file(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Md5::new();
    io::copy(&mut file, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}
