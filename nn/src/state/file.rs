//! Safetensors files: a [`StateDict`] written and read in the format PyTorch
//! and Hugging Face use, with PyTorch's key names.
//!
//! A checkpoint comes from outside, so reading treats it as hostile: the
//! header is validated (size, JSON, duplicate keys, dtypes, offsets that
//! overlap or leave gaps or run past the end) before any tensor is copied,
//! every error names the file, and nothing panics. Writing is atomic: the
//! bytes go to a temporary file beside the target, are synced, then renamed
//! over it, so a failure mid-save leaves the previous file as it was.

use super::StateDict;
use forma_core::{DType, TensorData};
use std::collections::BTreeMap;
use std::fmt;
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

/// Reads a tensor's bytes as Forma data. Narrow integer types widen to i64
/// (checkpoints often keep position ids as i32).
fn to_data(
    path: &str,
    key: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<TensorData, CheckpointError> {
    use safetensors::Dtype as S;
    let dims = view.shape().to_vec();
    let bytes = view.data();
    let direct = |dtype| TensorData::from_bytes(dtype, dims.clone(), bytes.to_vec());
    let widened = |values: Vec<i64>| TensorData::from_vec(&values, dims.clone());
    let data = match view.dtype() {
        S::F32 => direct(DType::F32),
        S::F64 => direct(DType::F64),
        S::F16 => direct(DType::F16),
        S::BF16 => direct(DType::BF16),
        S::I64 => direct(DType::I64),
        S::U32 => direct(DType::U32),
        S::BOOL => {
            if let Some(b) = bytes.iter().find(|b| **b > 1) {
                return Err(CheckpointError::Format {
                    path: path.to_string(),
                    msg: format!("tensor `{key}` is bool but holds the byte {b}"),
                });
            }
            direct(DType::Bool)
        }
        S::I32 => widened(
            bytes
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        S::I16 => widened(
            bytes
                .chunks_exact(2)
                .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        S::I8 => widened(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        S::U8 => widened(bytes.iter().map(|&b| i64::from(b)).collect()),
        other => {
            return Err(CheckpointError::UnsupportedDtype {
                path: path.to_string(),
                key: key.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    data.map_err(|e| CheckpointError::Format {
        path: path.to_string(),
        msg: format!("tensor `{key}`: {e}"),
    })
}

/// Finds a key that appears twice at the top level of the header (a JSON map
/// would silently keep the last one).
fn duplicate_key(header: &str) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(k.clone()) {
                    return Ok(Some(k));
                }
            }
            Ok(None)
        }
    }
    serde_json::Deserializer::from_str(header)
        .deserialize_map(Keys)
        .ok()
        .flatten()
}

/// Parses a whole safetensors buffer. `path` names it in errors.
///
/// # Errors
/// [`CheckpointError::Format`] for anything malformed (the message says what),
/// [`CheckpointError::UnsupportedDtype`] and [`CheckpointError::Version`].
pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Checkpoint, CheckpointError> {
    let format = |msg: String| CheckpointError::Format {
        path: path.to_string(),
        msg,
    };
    // The crate validates sizes, JSON, dtypes and offsets; duplicates and a
    // clearer message for the length prefix are checked here first.
    if bytes.len() < 8 {
        return Err(format(format!(
            "the file has {} bytes, fewer than the 8-byte header length",
            bytes.len()
        )));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if n > (bytes.len() - 8) as u64 {
        return Err(format(format!(
            "the header claims {n} bytes but only {} follow the length prefix",
            bytes.len() - 8
        )));
    }
    let header = std::str::from_utf8(&bytes[8..8 + n as usize])
        .map_err(|e| format(format!("the header is not UTF-8: {e}")))?;
    if let Some(k) = duplicate_key(header) {
        return Err(format(format!("the key `{k}` appears twice in the header")));
    }
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| format(e.to_string()))?;
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| format(e.to_string()))?;
    let metadata: BTreeMap<String, String> = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    if let Some(v) = metadata.get(FORMAT_VERSION_KEY) {
        let newer = v.parse::<u32>().map_or(true, |v| v > 1);
        if newer {
            return Err(CheckpointError::Version {
                path: path.to_string(),
                found: v.clone(),
            });
        }
    }
    let mut names = st.names();
    names.sort_unstable();
    let mut tensors = StateDict::new();
    for key in names {
        let view = st.tensor(key).map_err(|e| format(e.to_string()))?;
        tensors.insert(key, to_data(path, key, &view)?);
    }
    Ok(Checkpoint { tensors, metadata })
}

/// Reads a safetensors file, memory-mapped.
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be opened or mapped, else as
/// [`from_bytes`].
pub fn load_file(path: impl AsRef<Path>) -> Result<Checkpoint, CheckpointError> {
    let path = path.as_ref();
    let io = |source| CheckpointError::Io {
        path: name(path),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and dropped before returning; a file
    // truncated by another process while mapped can fault, which is the
    // documented limit of memory-mapped reads (the same as PyTorch's
    // `safe_open`). Checkpoints being written are never mapped: saves go to a
    // temporary file that is renamed into place.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
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
    let tmp = dir.join(format!(".{file_name}.tmp-{}-{n}", std::process::id()));
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

    #[test]
    fn duplicate_header_keys_are_found() {
        assert_eq!(
            duplicate_key(r#"{"a": 1, "b": {"a": 2}, "a": 3}"#),
            Some("a".to_string())
        );
        assert_eq!(duplicate_key(r#"{"a": 1, "b": 2}"#), None);
    }
}
