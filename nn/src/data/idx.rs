//! The IDX file format that MNIST (and Fashion-MNIST, KMNIST, EMNIST) ship in.
//!
//! A file is a 4-byte magic number `00 00 TT RR` (`TT` the element type, `RR`
//! the rank), then `RR` big-endian `u32` dims, then the elements, big-endian,
//! row-major. A file whose first bytes are the gzip magic (`1f 8b`) is
//! decompressed on the fly, so `train-images-idx3-ubyte.gz` reads as is.
//!
//! Files are untrusted: the header is checked (magic, type, rank, the size
//! the dims declare, computed without overflow) and, for plain files, compared
//! with the file's length *before* anything is allocated, so a hostile header
//! cannot make the reader allocate gigabytes. A gzip file's size is unknown
//! until it is decompressed, so its data is read incrementally, never trusting
//! the declared size for an up-front allocation. Every error names the file.

use super::DataError;
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The largest rank the reader accepts. IDX allows 255; real files have 1 to
/// 4, so anything past this is taken for a corrupt header.
pub const MAX_IDX_RANK: u8 = 8;

/// How much a gzip file's data may reserve up front: a tiny hostile file can
/// declare exabytes, so beyond this the buffer grows only as bytes arrive.
const GZ_RESERVE_CAP: usize = 4 << 20;

/// How many trailing bytes of a gzip file are decompressed, at most, to
/// count them for the error message: decompression stops soon after the
/// size the header declares, so a bomb behind a small header costs nothing.
const GZ_TRAILING_COUNT_CAP: u64 = 64 << 10;

/// The element type of an IDX file (the magic number's third byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdxType {
    /// `0x08`: unsigned byte.
    U8,
    /// `0x09`: signed byte.
    I8,
    /// `0x0B`: big-endian 16-bit integer.
    I16,
    /// `0x0C`: big-endian 32-bit integer.
    I32,
    /// `0x0D`: big-endian 32-bit float.
    F32,
    /// `0x0E`: big-endian 64-bit float.
    F64,
}

impl IdxType {
    /// The type for a type byte, if it is one of the six IDX defines.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    /// The type byte.
    pub fn code(self) -> u8 {
        match self {
            IdxType::U8 => 0x08,
            IdxType::I8 => 0x09,
            IdxType::I16 => 0x0B,
            IdxType::I32 => 0x0C,
            IdxType::F32 => 0x0D,
            IdxType::F64 => 0x0E,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    /// The Rust name of the element type.
    pub fn name(self) -> &'static str {
        match self {
            IdxType::U8 => "u8",
            IdxType::I8 => "i8",
            IdxType::I16 => "i16",
            IdxType::I32 => "i32",
            IdxType::F32 => "f32",
            IdxType::F64 => "f64",
        }
    }
}

/// The elements of an IDX file, decoded from big-endian.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxData {
    /// `0x08`
    U8(Vec<u8>),
    /// `0x09`
    I8(Vec<i8>),
    /// `0x0B`
    I16(Vec<i16>),
    /// `0x0C`
    I32(Vec<i32>),
    /// `0x0D`
    F32(Vec<f32>),
    /// `0x0E`
    F64(Vec<f64>),
}

impl IdxData {
    /// The element type.
    pub fn idx_type(&self) -> IdxType {
        match self {
            IdxData::U8(_) => IdxType::U8,
            IdxData::I8(_) => IdxType::I8,
            IdxData::I16(_) => IdxType::I16,
            IdxData::I32(_) => IdxType::I32,
            IdxData::F32(_) => IdxType::F32,
            IdxData::F64(_) => IdxType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            IdxData::U8(v) => v.len(),
            IdxData::I8(v) => v.len(),
            IdxData::I16(v) => v.len(),
            IdxData::I32(v) => v.len(),
            IdxData::F32(v) => v.len(),
            IdxData::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as f64 (exact for all six types).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            IdxData::U8(v) => v.iter().map(|&x| x as f64).collect(),
            IdxData::I8(v) => v.iter().map(|&x| x as f64).collect(),
            IdxData::I16(v) => v.iter().map(|&x| x as f64).collect(),
            IdxData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            IdxData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            IdxData::F64(v) => v.clone(),
        }
    }
}

/// A whole IDX file: its dims and its elements (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct IdxArray {
    /// The dims the header declares (rank 1 to [`MAX_IDX_RANK`]).
    pub dims: Vec<usize>,
    /// The elements; `data.len()` is the product of `dims`.
    pub data: IdxData,
}

/// A rank-3 `u8` IDX file: `count` images of `rows` x `cols` pixels.
#[derive(Clone, PartialEq, Eq)]
pub struct IdxImages {
    /// Number of images.
    pub count: usize,
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// The pixels, image after image, each row-major: `count * rows * cols` bytes.
    pub data: Vec<u8>,
}

impl IdxImages {
    /// The pixels of image `i`, or `None` past the end.
    pub fn image(&self, i: usize) -> Option<&[u8]> {
        let n = self.rows * self.cols;
        (i < self.count).then(|| &self.data[i * n..(i + 1) * n])
    }
}

impl std::fmt::Debug for IdxImages {
    // The pixels would swamp the output; the sizes say what it is.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdxImages")
            .field("count", &self.count)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

/// Reads any IDX file: the six element types, rank 1 to [`MAX_IDX_RANK`],
/// plain or gzip-compressed.
///
/// # Errors
/// A [`DataError`] naming the file: [`DataError::NotFound`], [`DataError::Io`],
/// [`DataError::Gzip`], [`DataError::BadMagic`], [`DataError::UnsupportedType`],
/// [`DataError::BadRank`], [`DataError::SizeOverflow`],
/// [`DataError::Truncated`] or [`DataError::TrailingBytes`].
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray, DataError> {
    read_idx_limited(path, u64::MAX)
}

/// [`read_idx`], refusing a file whose header declares more than
/// `max_data_bytes` bytes of data before anything is allocated or
/// decompressed: for files from outside whose size the caller knows to
/// expect (an MNIST images file holds 47 MB).
///
/// # Errors
/// Those of [`read_idx`], and [`DataError::TooLarge`].
pub fn read_idx_limited(
    path: impl AsRef<Path>,
    max_data_bytes: u64,
) -> Result<IdxArray, DataError> {
    let path = path.as_ref();
    let (ty, dims, bytes) = read_raw(path, max_data_bytes)?;
    let data = match ty {
        IdxType::U8 => IdxData::U8(bytes),
        IdxType::I8 => IdxData::I8(bytes.iter().map(|&b| b as i8).collect()),
        IdxType::I16 => IdxData::I16(
            bytes
                .chunks_exact(2)
                .map(|c| i16::from_be_bytes([c[0], c[1]]))
                .collect(),
        ),
        IdxType::I32 => IdxData::I32(
            bytes
                .chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        IdxType::F32 => IdxData::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        IdxType::F64 => IdxData::F64(
            bytes
                .chunks_exact(8)
                .map(|c| f64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
    };
    Ok(IdxArray { dims, data })
}

/// Reads an MNIST-style images file: `u8`, rank 3 (`count, rows, cols`).
///
/// # Errors
/// Those of [`read_idx`], and [`DataError::WrongContent`] for a valid IDX
/// file of another type or rank.
pub fn read_idx_images(path: impl AsRef<Path>) -> Result<IdxImages, DataError> {
    let path = path.as_ref();
    let arr = read_idx(path)?;
    match (arr.dims.as_slice(), arr.data) {
        (&[count, rows, cols], IdxData::U8(data)) => Ok(IdxImages {
            count,
            rows,
            cols,
            data,
        }),
        (_, data) => Err(wrong_content(
            path,
            "u8 images [count, rows, cols]",
            data.idx_type(),
            &arr.dims,
        )),
    }
}

/// Reads an MNIST-style labels file: `u8`, rank 1.
///
/// # Errors
/// Those of [`read_idx`], and [`DataError::WrongContent`] for a valid IDX
/// file of another type or rank.
pub fn read_idx_labels(path: impl AsRef<Path>) -> Result<Vec<u8>, DataError> {
    let path = path.as_ref();
    let arr = read_idx(path)?;
    match (arr.dims.len(), arr.data) {
        (1, IdxData::U8(data)) => Ok(data),
        (_, data) => Err(wrong_content(
            path,
            "u8 labels [count]",
            data.idx_type(),
            &arr.dims,
        )),
    }
}

fn wrong_content(path: &Path, expected: &str, ty: IdxType, dims: &[usize]) -> DataError {
    DataError::WrongContent {
        path: path.to_path_buf(),
        expected: expected.to_string(),
        found: format!("{} {dims:?}", ty.name()),
    }
}

/// Reads `buf.len()` bytes or up to the end of `r`; returns how many came.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Where the bytes come from: the file itself (length known up front) or its
/// gzip decoding (length known only by reading).
enum Source {
    Plain { file: BufReader<File>, len: u64 },
    Gz(Box<MultiGzDecoder<BufReader<File>>>),
}

impl Source {
    fn open(path: &Path) -> Result<Self, DataError> {
        let io_err = |source: io::Error| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = File::open(path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => DataError::NotFound {
                path: path.to_path_buf(),
            },
            _ => io_err(source),
        })?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(io_err(io::Error::other("is a directory")));
        }
        let mut head = [0u8; 2];
        let n = read_up_to(&mut file, &mut head).map_err(io_err)?;
        file.seek(SeekFrom::Start(0)).map_err(io_err)?;
        let file = BufReader::new(file);
        Ok(if n == 2 && head == [0x1f, 0x8b] {
            Source::Gz(Box::new(MultiGzDecoder::new(file)))
        } else {
            Source::Plain {
                file,
                len: meta.len(),
            }
        })
    }

    /// Reads up to `buf.len()` bytes, mapping errors to the file.
    fn read_up_to(&mut self, path: &Path, buf: &mut [u8]) -> Result<usize, DataError> {
        match self {
            Source::Plain { file, .. } => read_up_to(file, buf).map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                source,
            }),
            Source::Gz(dec) => read_up_to(dec, buf).map_err(|e| gz_error(path, e)),
        }
    }
}

/// A decoder error is corrupt data unless the file itself failed to read.
fn gz_error(path: &Path, source: io::Error) -> DataError {
    match source.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
            DataError::Gzip {
                path: path.to_path_buf(),
                source,
            }
        }
        _ => DataError::Io {
            path: path.to_path_buf(),
            source,
        },
    }
}

/// Reads and checks the header, then the data bytes (still big-endian).
fn read_raw(path: &Path, limit: u64) -> Result<(IdxType, Vec<usize>, Vec<u8>), DataError> {
    let p = || path.to_path_buf();
    let mut src = Source::open(path)?;

    let mut magic = [0u8; 4];
    let got = src.read_up_to(path, &mut magic)?;
    if got >= 2 && magic[..2] != [0, 0] {
        return Err(DataError::BadMagic { path: p(), magic });
    }
    if got < 4 {
        return Err(DataError::Truncated {
            path: p(),
            what: "header",
            expected: 4,
            found: got as u64,
        });
    }
    let ty = IdxType::from_code(magic[2]).ok_or(DataError::UnsupportedType {
        path: p(),
        code: magic[2],
    })?;
    let rank = magic[3];
    if rank == 0 || rank > MAX_IDX_RANK {
        return Err(DataError::BadRank { path: p(), rank });
    }

    let header_len = 4 + 4 * rank as usize;
    let mut dim_bytes = vec![0u8; 4 * rank as usize];
    let got = src.read_up_to(path, &mut dim_bytes)?;
    if got < dim_bytes.len() {
        return Err(DataError::Truncated {
            path: p(),
            what: "header",
            expected: header_len as u64,
            found: (4 + got) as u64,
        });
    }
    let dims64: Vec<u64> = dim_bytes
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64)
        .collect();

    // The sizes in u64 first (the file length is a u64), then they must also
    // fit this machine's usize.
    let overflow = || DataError::SizeOverflow {
        path: p(),
        dims: dims64.clone(),
        elem_size: ty.size(),
    };
    let data_len = dims64
        .iter()
        .try_fold(ty.size() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let total = data_len
        .checked_add(header_len as u64)
        .ok_or_else(overflow)?;
    if data_len > limit {
        return Err(DataError::TooLarge {
            path: p(),
            declared: data_len,
            limit,
        });
    }
    let data_len_usize = usize::try_from(data_len).map_err(|_| overflow())?;
    let dims: Vec<usize> = dims64
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| overflow()))
        .collect::<Result<_, _>>()?;

    let data = match &mut src {
        Source::Plain { file, len } => {
            let len = *len;
            if len < total {
                return Err(DataError::Truncated {
                    path: p(),
                    what: "data",
                    expected: total,
                    found: len,
                });
            }
            if len > total {
                return Err(DataError::TrailingBytes {
                    path: p(),
                    expected: total,
                    found: len,
                    counted_all: true,
                });
            }
            // The length check above bounds this allocation by the file's size.
            let mut data = vec![0u8; data_len_usize];
            let got = read_up_to(file, &mut data)
                .map_err(|source| DataError::Io { path: p(), source })?;
            if got < data_len_usize {
                // The file shrank between the length check and the read.
                return Err(DataError::Truncated {
                    path: p(),
                    what: "data",
                    expected: total,
                    found: (header_len + got) as u64,
                });
            }
            data
        }
        Source::Gz(dec) => {
            let mut data = Vec::with_capacity(data_len_usize.min(GZ_RESERVE_CAP));
            let got = dec
                .as_mut()
                .take(data_len)
                .read_to_end(&mut data)
                .map_err(|e| gz_error(path, e))?;
            if (got as u64) < data_len {
                return Err(DataError::Truncated {
                    path: p(),
                    what: "data",
                    expected: total,
                    found: header_len as u64 + got as u64,
                });
            }
            let extra = io::copy(
                &mut dec.as_mut().take(GZ_TRAILING_COUNT_CAP),
                &mut io::sink(),
            )
            .map_err(|e| gz_error(path, e))?;
            if extra > 0 {
                return Err(DataError::TrailingBytes {
                    path: p(),
                    expected: total,
                    found: total + extra,
                    counted_all: extra < GZ_TRAILING_COUNT_CAP,
                });
            }
            data
        }
    };
    Ok((ty, dims, data))
}

/// The path of a file that may also exist gzip-compressed: `path` if it
/// exists, else `path.gz` if that does, else `path` (so the error names it).
pub(crate) fn plain_or_gz(path: PathBuf) -> PathBuf {
    if path.exists() {
        return path;
    }
    let mut gz = path.clone().into_os_string();
    gz.push(".gz");
    let gz = PathBuf::from(gz);
    if gz.exists() {
        gz
    } else {
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::{write::GzEncoder, Compression};
    use std::io::Write;

    fn gz_file(tag: &str, header: &[u8], zeros: usize) -> PathBuf {
        let path = std::env::temp_dir().join(format!("forma-idx-{tag}-{}.gz", std::process::id()));
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(header).unwrap();
        let block = vec![0u8; 1 << 20];
        let mut left = zeros;
        while left > 0 {
            let n = left.min(block.len());
            enc.write_all(&block[..n]).unwrap();
            left -= n;
        }
        std::fs::write(&path, enc.finish().unwrap()).unwrap();
        path
    }

    /// A small header followed by 64 MiB of zeros (a 64 KiB `.gz`):
    /// decompression stops shortly past the declared 16 bytes.
    #[test]
    fn a_gzip_bomb_behind_a_small_header_is_not_decompressed() {
        let mut header = vec![0, 0, 0x08, 1];
        header.extend(16u32.to_be_bytes());
        let path = gz_file("bomb", &header, 64 << 20);
        let err = read_idx(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        match &err {
            DataError::TrailingBytes {
                expected,
                found,
                counted_all,
                ..
            } => {
                assert_eq!(*expected, 8 + 16);
                assert!(*found <= expected + GZ_TRAILING_COUNT_CAP, "{found}");
                assert!(!counted_all);
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("at least"), "{err}");
    }

    /// A header declaring more than the caller allows is refused before any
    /// data is decompressed (the file holds none: it would be `Truncated`).
    #[test]
    fn a_caller_limit_refuses_a_large_declaration_up_front() {
        let mut header = vec![0, 0, 0x0E, 1];
        header.extend((1u32 << 20).to_be_bytes());
        let path = gz_file("limit", &header, 0);
        let err = read_idx_limited(&path, 1 << 20).unwrap_err();
        let plain = read_idx(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(err, DataError::TooLarge { declared, limit, .. } if declared == 8 << 20 && limit == 1 << 20),
            "{err:?}"
        );
        assert!(matches!(plain, DataError::Truncated { .. }), "{plain:?}");
    }
}
