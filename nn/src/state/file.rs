//! Safetensors files: a [`StateDict`] written and read in the format PyTorch
//! and Hugging Face use, with PyTorch's key names.
//!
//! A checkpoint comes from outside, so reading treats it as hostile, in time
//! and memory bounded by the file's size:
//!
//! - the path must be a regular file (a directory, FIFO or device is refused
//!   by its type, before it is opened);
//! - the header is parsed and checked here (size, JSON, duplicate keys,
//!   dtypes, shapes whose size overflows, offsets that overlap, leave gaps or
//!   run past the end), each problem naming its tensor, before any tensor is
//!   read;
//! - loading into a module ([`Module::load_safetensors`](crate::Module::load_safetensors))
//!   checks names, sizes and dtypes from the header alone and converts only
//!   the tensors it will write, one at a time: memory is at most the mapped
//!   file plus the model's tensors;
//! - a refusal's message lists at most [`LISTED_IN_MESSAGE`](super::LISTED_IN_MESSAGE)
//!   entries of each kind, names cut to 200 characters, with "did you mean"
//!   hints only for a strict load and within a fixed budget of work.
//!
//! Every error names the file, and nothing panics. Writing is atomic: the
//! bytes go to a temporary file beside the target, are synced, then renamed
//! over it, so a failure mid-save leaves the previous file as it was; a save
//! also removes the temporaries that killed saves of the same file left
//! (those whose process is gone).

use super::header::{shown, to_data, Entry, Header, StoredDtype};
use super::{LoadOptions, LoadReport, Source, StateDict};
use forma_core::{DType, TensorData};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The metadata key Forma writes with its checkpoint format version.
pub const FORMAT_VERSION_KEY: &str = "forma_format_version";
/// The checkpoint format version this build writes and reads.
pub const FORMAT_VERSION: &str = "1";

/// Why reading or writing a checkpoint failed. Every variant names the file
/// (`<bytes>` for an in-memory buffer).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be opened, read, written, synced or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file.
    #[error("{path}: not a valid safetensors file: {msg}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// A tensor has a dtype Forma cannot hold.
    #[error("{path}: tensor `{key}` has dtype {dtype}, which Forma does not support")]
    UnsupportedDtype {
        /// The file.
        path: String,
        /// The tensor's name.
        key: String,
        /// The dtype as the file names it.
        dtype: String,
    },
    /// The file was written by a newer Forma checkpoint format.
    #[error(
        "{path}: checkpoint format version {found} is newer than this build's ({FORMAT_VERSION})"
    )]
    Version {
        /// The file.
        path: String,
        /// The version in the file.
        found: String,
    },
    /// The tensors did not fit the module (see [`super::LoadError`]); the module
    /// is unchanged.
    #[error("{path}: {source}")]
    Load {
        /// The file.
        path: String,
        /// Every missing, unexpected and mismatched key.
        source: super::LoadError,
    },
}

/// A state dict read from a file, with the file's metadata.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    /// The tensors, in the file's key order (sorted, as safetensors stores them).
    pub tensors: StateDict,
    /// The header's `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
}

fn name(path: &Path) -> String {
    path.display().to_string()
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F64 => safetensors::Dtype::F64,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I64 => safetensors::Dtype::I64,
        DType::U32 => safetensors::Dtype::U32,
        DType::Bool => safetensors::Dtype::BOOL,
    }
}

/// Checks the format version in the metadata: absent, or one this build reads.
fn check_version(path: &str, metadata: &BTreeMap<String, String>) -> Result<(), CheckpointError> {
    let Some(v) = metadata.get(FORMAT_VERSION_KEY) else {
        return Ok(());
    };
    match v.trim().parse::<u32>() {
        Ok(n) if n <= 1 => Ok(()),
        Ok(_) => Err(CheckpointError::Version {
            path: path.to_string(),
            found: v.clone(),
        }),
        Err(_) => Err(CheckpointError::Format {
            path: path.to_string(),
            msg: format!(
                "the checkpoint format version {} is not a version (this build writes {FORMAT_VERSION})",
                shown(v)
            ),
        }),
    }
}

/// A file's tensors as a load [`Source`]: sizes and dtypes from the header,
/// values converted one tensor at a time when they are written.
struct FileSource<'a> {
    path: &'a str,
    bytes: &'a [u8],
    header: Header,
}

impl<'a> FileSource<'a> {
    fn entry(&self, key: &str) -> Option<&Entry> {
        // Entries are sorted by name.
        self.header
            .entries
            .binary_search_by(|e| e.name.as_str().cmp(key))
            .ok()
            .map(|i| &self.header.entries[i])
    }

    fn bytes_of(&self, e: &Entry) -> &'a [u8] {
        &self.bytes[self.header.data_start + e.start..self.header.data_start + e.end]
    }
}

impl Source for FileSource<'_> {
    fn keys(&self) -> Vec<&str> {
        self.header
            .entries
            .iter()
            .map(|e| e.name.as_str())
            .collect()
    }
    fn info(&self, key: &str) -> Option<(&[usize], Option<DType>, &'static str)> {
        self.entry(key)
            .map(|e| (e.dims.as_slice(), e.dtype.read_as(), e.dtype.torch_name()))
    }
    fn data(&self, key: &str) -> Result<Cow<'_, TensorData>, String> {
        let e = self.entry(key).ok_or_else(|| format!("`{key}` vanished"))?;
        to_data(self.path, e, self.bytes_of(e))
            .map(Cow::Owned)
            .map_err(|e| e.to_string())
    }
}

/// Parses a whole safetensors buffer. `path` names it in errors.
///
/// # Errors
/// [`CheckpointError::Format`] for anything malformed (the message says what
/// and names the tensor), [`CheckpointError::UnsupportedDtype`] and
/// [`CheckpointError::Version`].
pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Checkpoint, CheckpointError> {
    let header = Header::parse(bytes, path)?;
    check_version(path, &header.metadata)?;
    let mut tensors = StateDict::new();
    for e in &header.entries {
        let data = &bytes[header.data_start + e.start..header.data_start + e.end];
        tensors.insert(e.name.clone(), to_data(path, e, data)?);
    }
    Ok(Checkpoint {
        tensors,
        metadata: header.metadata,
    })
}

/// Loads a safetensors buffer into `m`: names, sizes and dtypes are checked
/// from the header alone, and only the tensors that will be written are
/// converted, one at a time. On any error `m` is unchanged.
pub(crate) fn load_bytes_into<M: crate::Module>(
    m: &mut M,
    bytes: &[u8],
    path: &str,
    options: LoadOptions,
) -> Result<LoadReport, CheckpointError> {
    let header = Header::parse(bytes, path)?;
    check_version(path, &header.metadata)?;
    let source = FileSource {
        path,
        bytes,
        header,
    };
    // The one conversion that can fail (a bool byte other than 0 or 1) is
    // checked before anything is written, for the tensors that will be.
    let want = super::expected(m);
    for (key, _) in &want {
        if let Some(e) = source.entry(key).filter(|e| e.dtype == StoredDtype::Bool) {
            to_data(path, e, source.bytes_of(e))?;
        }
    }
    super::load_expected(m, &want, &source, options).map_err(|source| CheckpointError::Load {
        path: path.to_string(),
        source,
    })
}

/// Refuses a path that is not a regular file (a directory, a FIFO that would
/// block the read, a device) by its type, before opening it.
pub(crate) fn check_regular_file(path: &Path) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: name(path),
        source,
    };
    let ft = std::fs::metadata(path).map_err(io)?.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let what = if ft.is_dir() {
        "a directory"
    } else {
        special_file_kind(&ft)
    };
    Err(io(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("is {what}, not a checkpoint file"),
    )))
}

#[cfg(unix)]
fn special_file_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "not a regular file"
}

/// Maps a file read-only, after checking it is a regular file.
fn map_file(path: &Path) -> Result<memmap2::Mmap, CheckpointError> {
    check_regular_file(path)?;
    let io = |source| CheckpointError::Io {
        path: name(path),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and dropped before the caller returns; a
    // file truncated by another process while mapped can fault, which is the
    // documented limit of memory-mapped reads (the same as PyTorch's
    // `safe_open`). Checkpoints being written are never mapped: saves go to a
    // temporary file that is renamed into place.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io)
}

/// [`load_bytes_into`] from a file, memory-mapped.
pub(crate) fn load_file_into<M: crate::Module>(
    m: &mut M,
    path: &Path,
    options: LoadOptions,
) -> Result<LoadReport, CheckpointError> {
    let map = map_file(path)?;
    load_bytes_into(m, &map, &name(path), options)
}

/// Reads a safetensors file, memory-mapped.
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be opened or mapped, else as
/// [`from_bytes`].
pub fn load_file(path: impl AsRef<Path>) -> Result<Checkpoint, CheckpointError> {
    let path = path.as_ref();
    let map = map_file(path)?;
    from_bytes(&map, &name(path))
}

/// The bytes of a safetensors file holding `sd`, with `metadata` plus
/// Forma's format version and `"format": "pt"` (what PyTorch's loaders
/// expect). The bytes depend only on the contents: keys (and metadata) are
/// written sorted, so saving the same weights twice gives the same file.
///
/// # Errors
/// Never for a state dict built through [`TensorData`] (kept fallible for
/// future formats).
pub fn to_bytes(
    sd: &StateDict,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, CheckpointError> {
    let mut meta = metadata.clone();
    meta.entry("format".to_string())
        .or_insert_with(|| "pt".to_string());
    meta.insert(FORMAT_VERSION_KEY.to_string(), FORMAT_VERSION.to_string());
    meta.insert(
        "framework".to_string(),
        format!("forma {}", env!("CARGO_PKG_VERSION")),
    );
    let mut entries: Vec<(&str, &TensorData)> = sd.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    // serde_json's map is ordered by key, so the header text is canonical.
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".to_string(), serde_json::json!(meta));
    let mut offset = 0usize;
    for (key, d) in &entries {
        let end = offset + d.bytes().len();
        header.insert(
            key.to_string(),
            serde_json::json!({
                "dtype": st_dtype(d.dtype()).to_string(),
                "shape": d.dims(),
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&header).map_err(|e| CheckpointError::Format {
        path: "<bytes>".to_string(),
        msg: e.to_string(),
    })?;
    // The format pads the header with spaces to a multiple of 8 bytes.
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + offset);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    for (_, d) in entries {
        out.extend_from_slice(d.bytes());
    }
    Ok(out)
}

/// Writes `sd` to `path` atomically (see the module docs).
///
/// # Errors
/// [`CheckpointError::Io`] naming the file; the previous file is intact.
pub fn save_file(
    sd: &StateDict,
    path: impl AsRef<Path>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let bytes = to_bytes(sd, metadata)?;
    write_atomic(path.as_ref(), |f| f.write_all(&bytes))
}

/// The start of the name of a save's temporary file for `file_name`; the
/// saving process's id and a counter follow.
fn tmp_prefix(file_name: &str) -> String {
    format!(".{file_name}.tmp-")
}

/// Whether process `pid` is alive (on Linux, by `/proc`; elsewhere assumed
/// alive, so only temporaries older than a day are taken for stale).
fn process_alive(pid: u32) -> Option<bool> {
    let proc = Path::new("/proc");
    proc.join("self")
        .exists()
        .then(|| proc.join(pid.to_string()).exists())
}

/// Removes temporary files a killed save of `file_name` left in `dir`: those
/// of this naming scheme, older than `now`, written by a process that is no
/// longer running (never this process's own, which may be saving). Failures
/// are ignored: cleaning up is a courtesy, not part of the save.
fn remove_stale_temporaries(dir: &Path, file_name: &str, now: std::time::SystemTime) {
    let prefix = tmp_prefix(file_name);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((pid, count)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), true) = (pid.parse::<u32>(), count.parse::<u64>().is_ok()) else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let age = meta
            .modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok());
        let stale = match (pid == me, process_alive(pid), age) {
            (true, _, _) | (_, _, None) => false,
            (false, Some(alive), Some(_)) => !alive,
            (false, None, Some(age)) => age.as_secs() > 24 * 3600,
        };
        if stale && meta.is_file() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes a file by writing a temporary sibling, syncing it, and renaming it
/// over `path`; on any failure the temporary file is removed and `path` is
/// untouched.
pub(crate) fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: name(path),
        source,
    };
    let file_name = path
        .file_name()
        .ok_or_else(|| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the path has no file name",
            ))
        })?
        .to_string_lossy()
        .into_owned();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        "{}{}-{n}",
        tmp_prefix(&file_name),
        std::process::id()
    ));
    remove_stale_temporaries(&dir, &file_name, std::time::SystemTime::now());
    let result = (|| {
        let mut f = File::create(&tmp)?;
        write(&mut f)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Persist the rename itself (the directory entry).
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StateDict {
        let mut sd = StateDict::new();
        sd.insert(
            "b.weight",
            TensorData::from_vec(&[1.5f32, -2.0, 3.25, 0.0], vec![2, 2]).unwrap(),
        );
        sd.insert("a.count", TensorData::from_vec(&[7i64], vec![]).unwrap());
        sd
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("forma-file-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trips_tensors_and_metadata() {
        let d = tmpdir("roundtrip");
        let p = d.join("m.safetensors");
        let meta = BTreeMap::from([("note".to_string(), "hi".to_string())]);
        save_file(&sample(), &p, &meta).unwrap();
        let ck = load_file(&p).unwrap();
        assert_eq!(
            ck.tensors.keys().collect::<Vec<_>>(),
            ["a.count", "b.weight"]
        );
        assert_eq!(ck.tensors.get("b.weight"), sample().get("b.weight"));
        assert_eq!(ck.metadata["note"], "hi");
        assert_eq!(ck.metadata["format"], "pt");
        assert_eq!(ck.metadata[FORMAT_VERSION_KEY], FORMAT_VERSION);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_failed_save_leaves_the_previous_file_and_no_temporary() {
        let d = tmpdir("atomic");
        let p = d.join("m.safetensors");
        save_file(&sample(), &p, &BTreeMap::new()).unwrap();
        let before = std::fs::read(&p).unwrap();
        let err = write_atomic(&p, |f| {
            f.write_all(b"partial")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("m.safetensors") && err.to_string().contains("disk full"));
        assert_eq!(std::fs::read(&p).unwrap(), before);
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 1, "the temporary file was removed");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_same_weights_give_the_same_bytes_and_safetensors_reads_them() {
        let a = to_bytes(&sample(), &BTreeMap::new()).unwrap();
        let b = to_bytes(&sample(), &BTreeMap::new()).unwrap();
        assert_eq!(a, b);
        let st = safetensors::SafeTensors::deserialize(&a).unwrap();
        assert_eq!(st.tensor("b.weight").unwrap().shape(), [2, 2]);
        assert_eq!(
            st.tensor("a.count").unwrap().dtype(),
            safetensors::Dtype::I64
        );
    }
}
