//! The safetensors header, parsed and checked here rather than by the
//! `safetensors` crate, so that every problem with one tensor names it and
//! nothing about a tensor is read from its data before the whole header has
//! been validated.
//!
//! The format: an 8-byte little-endian header length `n`, `n` bytes of JSON
//! mapping each tensor name to `{"dtype", "shape", "data_offsets": [start,
//! end]}` (offsets relative to the data that follows the header) plus an
//! optional `"__metadata__"` map of strings, then the data. The checks: the
//! JSON is an object with no key twice; every entry has the three fields, a
//! dtype the format defines, a shape whose element count and byte size fit
//! without overflow and agree with its byte span; the spans lie inside the
//! data and cover it exactly, with neither overlaps nor gaps. Time and memory
//! are linear in the header's size.

use super::file::CheckpointError;
use forma_core::{DType, TensorData};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// A dtype as the file stores it. Forma holds some directly; the narrow
/// integer types are widened to `int64` when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredDtype {
    /// `F64`.
    F64,
    /// `F32`.
    F32,
    /// `F16`.
    F16,
    /// `BF16`.
    BF16,
    /// `I64`.
    I64,
    /// `I32` (read as `int64`).
    I32,
    /// `I16` (read as `int64`).
    I16,
    /// `I8` (read as `int64`).
    I8,
    /// `U8` (read as `int64`).
    U8,
    /// `U32`.
    U32,
    /// `BOOL`.
    Bool,
    /// A dtype the format defines that Forma cannot hold (`U16`, `U64`,
    /// `F8_E4M3`, ...), by its name in the file.
    Other(&'static str),
}

/// Dtypes the format defines that Forma does not hold, with their sizes.
const OTHER: [(&str, usize); 7] = [
    ("U16", 2),
    ("U64", 8),
    ("F8_E4M3", 1),
    ("F8_E5M2", 1),
    ("F8_E8M0", 1),
    ("C64", 8),
    ("F4", 1),
];

impl StoredDtype {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "F64" => StoredDtype::F64,
            "F32" => StoredDtype::F32,
            "F16" => StoredDtype::F16,
            "BF16" => StoredDtype::BF16,
            "I64" => StoredDtype::I64,
            "I32" => StoredDtype::I32,
            "I16" => StoredDtype::I16,
            "I8" => StoredDtype::I8,
            "U8" => StoredDtype::U8,
            "U32" => StoredDtype::U32,
            "BOOL" => StoredDtype::Bool,
            _ => {
                return OTHER
                    .iter()
                    .find(|(n, _)| *n == s)
                    .map(|(n, _)| StoredDtype::Other(n))
            }
        })
    }

    /// Bytes per element (for the sub-byte `F4`, the packed pair's byte).
    pub fn size(self) -> usize {
        match self {
            StoredDtype::F64 | StoredDtype::I64 => 8,
            StoredDtype::F32 | StoredDtype::I32 | StoredDtype::U32 => 4,
            StoredDtype::F16 | StoredDtype::BF16 | StoredDtype::I16 => 2,
            StoredDtype::I8 | StoredDtype::U8 | StoredDtype::Bool => 1,
            StoredDtype::Other(n) => OTHER.iter().find(|(m, _)| *m == n).map_or(1, |(_, s)| *s),
        }
    }

    /// The dtype Forma reads it as, or `None` when it cannot hold it.
    pub fn read_as(self) -> Option<DType> {
        Some(match self {
            StoredDtype::F64 => DType::F64,
            StoredDtype::F32 => DType::F32,
            StoredDtype::F16 => DType::F16,
            StoredDtype::BF16 => DType::BF16,
            StoredDtype::I64 | StoredDtype::I32 | StoredDtype::I16 | StoredDtype::I8 => DType::I64,
            StoredDtype::U8 => DType::I64,
            StoredDtype::U32 => DType::U32,
            StoredDtype::Bool => DType::Bool,
            StoredDtype::Other(_) => return None,
        })
    }

    /// PyTorch's name for it (`uint8`, `bfloat16`), as errors print it.
    pub fn torch_name(self) -> &'static str {
        match self {
            StoredDtype::F64 => "float64",
            StoredDtype::F32 => "float32",
            StoredDtype::F16 => "float16",
            StoredDtype::BF16 => "bfloat16",
            StoredDtype::I64 => "int64",
            StoredDtype::I32 => "int32",
            StoredDtype::I16 => "int16",
            StoredDtype::I8 => "int8",
            StoredDtype::U8 => "uint8",
            StoredDtype::U32 => "uint32",
            StoredDtype::Bool => "bool",
            StoredDtype::Other(n) => n,
        }
    }
}

impl fmt::Display for StoredDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// One tensor's entry: where its bytes are and what they hold.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub name: String,
    pub dtype: StoredDtype,
    pub dims: Vec<usize>,
    /// Byte range within the data section.
    pub start: usize,
    pub end: usize,
}

/// A parsed and validated file: the entries sorted by name, the metadata,
/// and where the data begins.
pub(crate) struct Header {
    pub entries: Vec<Entry>,
    pub metadata: BTreeMap<String, String>,
    pub data_start: usize,
}

/// The largest header accepted, as the safetensors crate's limit: parsing
/// holds the header's JSON in memory, a few times its size.
const MAX_HEADER: u64 = 100_000_000;

/// Names longer than this are cut in messages (a hostile file's names can be
/// megabytes long).
const NAME_IN_MESSAGE: usize = 200;

/// `name` for an error message, cut past [`NAME_IN_MESSAGE`] characters.
pub(crate) fn shown_bare(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(NAME_IN_MESSAGE) {
        None => name.into(),
        Some((i, _)) => format!("{}… ({} bytes)", &name[..i], name.len()).into(),
    }
}

/// `name` for an error message: quoted, and cut past [`NAME_IN_MESSAGE`]
/// characters.
pub(crate) fn shown(name: &str) -> String {
    format!("`{}`", shown_bare(name))
}

impl Header {
    /// Parses and checks the header of `bytes` (a whole file). `path` names
    /// the file in errors.
    pub fn parse(bytes: &[u8], path: &str) -> Result<Header, CheckpointError> {
        let format = |msg: String| CheckpointError::Format {
            path: path.to_string(),
            msg,
        };
        if bytes.len() < 8 {
            return Err(format(format!(
                "the file has {} bytes, fewer than the 8-byte header length",
                bytes.len()
            )));
        }
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let after = (bytes.len() - 8) as u64;
        if n > after {
            return Err(format(format!(
                "the header claims {n} bytes but only {after} follow the length prefix"
            )));
        }
        if n > MAX_HEADER {
            return Err(format(format!(
                "the header claims {n} bytes, more than the format's limit of {MAX_HEADER}"
            )));
        }
        let data_start = 8 + n as usize;
        let text = std::str::from_utf8(&bytes[8..data_start])
            .map_err(|e| format(format!("the header is not UTF-8: {e}")))?;
        let data_len = bytes.len() - data_start;
        let map = parse_object(text).map_err(format)?;

        let mut metadata = BTreeMap::new();
        let mut entries = Vec::with_capacity(map.len());
        for (name, value) in map {
            if name == "__metadata__" {
                metadata = parse_metadata(value).map_err(format)?;
                continue;
            }
            let entry = parse_entry(path, name, value)?;
            if entry.end > data_len {
                return Err(format(format!(
                    "tensor {}'s data ends at byte {} of the data, but the file holds {data_len} bytes of data",
                    shown(&entry.name),
                    entry.end
                )));
            }
            entries.push(entry);
        }
        check_coverage(&mut entries, data_len).map_err(format)?;
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(Header {
            entries,
            metadata,
            data_start,
        })
    }
}

/// The header's top-level object, in file order, refusing a key given twice
/// (a JSON map would silently keep the last one).
fn parse_object(text: &str) -> Result<Vec<(String, Value)>, String> {
    use serde::de::{Deserializer, MapAccess, Visitor};
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Result<Vec<(String, Value)>, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut out = Vec::new();
            while let Some(k) = map.next_key::<String>()? {
                let v: Value = map.next_value()?;
                if !seen.insert(k.clone()) {
                    return Ok(Err(format!(
                        "the key {} appears twice in the header",
                        shown(&k)
                    )));
                }
                out.push((k, v));
            }
            Ok(Ok(out))
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = de.deserialize_map(Entries).and_then(|r| {
        de.end()?;
        Ok(r)
    });
    match parsed {
        Ok(r) => r,
        Err(e) => Err(format!(
            "the header is not a valid JSON object: {e}{}",
            near(text, e.line(), e.column())
        )),
    }
}

/// ` (near "...")`: the header text around a JSON error, so that the message
/// shows the entry at fault and not just a column.
fn near(text: &str, line: usize, column: usize) -> String {
    let Some(l) = text.lines().nth(line.saturating_sub(1)) else {
        return String::new();
    };
    let at = l
        .char_indices()
        .nth(column.saturating_sub(1))
        .map_or(l.len(), |(i, _)| i);
    let from = l[..at].char_indices().rev().nth(40).map_or(0, |(i, _)| i);
    let to = l[at..]
        .char_indices()
        .nth(20)
        .map_or(l.len(), |(i, _)| at + i);
    format!(" (near \"{}\")", &l[from..to])
}

fn parse_metadata(value: Value) -> Result<BTreeMap<String, String>, String> {
    let Value::Object(m) = value else {
        return Err("`__metadata__` is not a map of strings".to_string());
    };
    m.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(format!(
                "`__metadata__` entry {} is not a string",
                shown(&k)
            )),
        })
        .collect()
}

fn parse_entry(path: &str, name: String, value: Value) -> Result<Entry, CheckpointError> {
    let bad = |msg: &str| CheckpointError::Format {
        path: path.to_string(),
        msg: format!("tensor {} {msg}", shown(&name)),
    };
    let Value::Object(fields) = &value else {
        return Err(bad("is not an object with dtype, shape and data_offsets"));
    };
    // Other fields are ignored, as the safetensors crate ignores them.
    let dtype_name = match fields.get("dtype") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(bad("has a dtype that is not a string")),
        None => return Err(bad("has no dtype")),
    };
    let dtype =
        StoredDtype::parse(dtype_name).ok_or_else(|| CheckpointError::UnsupportedDtype {
            path: path.to_string(),
            key: name.clone(),
            dtype: dtype_name.chars().take(NAME_IN_MESSAGE).collect(),
        })?;
    let numbers = |field: &str| -> Result<Vec<usize>, CheckpointError> {
        match fields.get(field) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| bad(&format!("has a {field} entry that is not a size: {v}")))
                })
                .collect(),
            Some(_) => Err(bad(&format!("has a {field} that is not a list"))),
            None => Err(bad(&format!("has no {field}"))),
        }
    };
    let dims = numbers("shape")?;
    let offsets = numbers("data_offsets")?;
    let [start, end] = offsets[..] else {
        return Err(bad(&format!(
            "has {} data_offsets, not [start, end]",
            offsets.len()
        )));
    };
    if end < start {
        return Err(bad(&format!(
            "ends (byte {end}) before it starts (byte {start})"
        )));
    }
    let nbytes = dims
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            bad(&format!(
                "has the shape {dims:?}, whose size in bytes overflows"
            ))
        })?;
    if nbytes != end - start {
        return Err(bad(&format!(
            "is {dtype} of shape {dims:?}, {nbytes} bytes, but its data_offsets span {} bytes",
            end - start
        )));
    }
    Ok(Entry {
        name,
        dtype,
        dims,
        start,
        end,
    })
}

/// The spans must tile the data: sorted by start, each begins where the one
/// before ends, the first at 0 and the last at the end of the file.
fn check_coverage(entries: &mut [Entry], data_len: usize) -> Result<(), String> {
    entries.sort_unstable_by_key(|e| (e.start, e.end));
    let mut at = 0usize;
    let mut before: Option<&Entry> = None;
    for e in entries.iter() {
        if e.start < at {
            let prev = before.map_or(String::new(), |p| shown(&p.name));
            return Err(format!(
                "tensors {prev} and {} overlap (bytes {}..{} and {}..{})",
                shown(&e.name),
                before.map_or(0, |p| p.start),
                at,
                e.start,
                e.end
            ));
        }
        if e.start > at {
            let after = before.map_or("the start of the data".to_string(), |p| {
                format!("tensor {}", shown(&p.name))
            });
            return Err(format!(
                "{} bytes no tensor owns lie between {after} and tensor {} (bytes {at}..{})",
                e.start - at,
                shown(&e.name),
                e.start
            ));
        }
        at = e.end;
        before = Some(e);
    }
    if at != data_len {
        let after = before.map_or("the header".to_string(), |p| {
            format!("the last tensor, {}", shown(&p.name))
        });
        return Err(format!(
            "{} bytes no tensor owns follow {after}",
            data_len - at
        ));
    }
    Ok(())
}

/// Converts one entry's bytes to Forma data: the narrow integer types widen
/// to `int64`, bools are checked to hold 0 or 1.
pub(crate) fn to_data(
    path: &str,
    entry: &Entry,
    bytes: &[u8],
) -> Result<TensorData, CheckpointError> {
    let dims = entry.dims.clone();
    let format = |msg: String| CheckpointError::Format {
        path: path.to_string(),
        msg: format!("tensor {}: {msg}", shown(&entry.name)),
    };
    let direct = |dtype| TensorData::from_bytes(dtype, dims.clone(), bytes.to_vec());
    let widened = |values: Vec<i64>| TensorData::from_vec(&values, dims.clone());
    let data = match entry.dtype {
        StoredDtype::F32 => direct(DType::F32),
        StoredDtype::F64 => direct(DType::F64),
        StoredDtype::F16 => direct(DType::F16),
        StoredDtype::BF16 => direct(DType::BF16),
        StoredDtype::I64 => direct(DType::I64),
        StoredDtype::U32 => direct(DType::U32),
        StoredDtype::Bool => {
            if let Some(b) = bytes.iter().find(|b| **b > 1) {
                return Err(format(format!("is bool but holds the byte {b}")));
            }
            direct(DType::Bool)
        }
        StoredDtype::I32 => widened(
            bytes
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        StoredDtype::I16 => widened(
            bytes
                .chunks_exact(2)
                .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        StoredDtype::I8 => widened(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        StoredDtype::U8 => widened(bytes.iter().map(|&b| i64::from(b)).collect()),
        StoredDtype::Other(name) => {
            return Err(CheckpointError::UnsupportedDtype {
                path: path.to_string(),
                key: entry.name.clone(),
                dtype: name.to_string(),
            })
        }
    };
    data.map_err(|e| format(e.to_string()))
}
