//! `forma::nn::data`: the IDX reader on well-formed and hostile files (plain
//! and gzip), the MNIST dataset, datasets and splits, and the DataLoader's
//! batching, shuffling, workers, collate and resumable position.
//!
//! IDX files are written byte by byte here (not with a Forma writer), so the
//! reader is checked against the format, not against itself.

use forma::nn::data::{
    random_split, read_idx, read_idx_images, read_idx_labels, split_lengths, DataError, DataLoader,
    Dataset, IdxData, IdxType, LoaderState, Mnist, MnistSplit, Subset, TensorDataset,
};
use forma::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ------------------------------------------------------------------ helpers

/// A fresh directory for one test under the system temp dir, removed when
/// the test ends.
struct TmpDir(PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp_dir(test: &str) -> TmpDir {
    let dir = std::env::temp_dir().join(format!("forma-nn-data-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TmpDir(dir)
}

/// An IDX file: magic `00 00 code rank`, big-endian u32 dims, then `payload`.
fn idx_bytes(code: u8, dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, code, dims.len() as u8];
    for d in dims {
        out.extend(d.to_be_bytes());
    }
    out.extend(payload);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A gzip file holding `data` in stored (uncompressed) deflate blocks: a
/// valid gzip stream written without a compressor.
fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let chunks: Vec<&[u8]> = if data.is_empty() {
        vec![&[]]
    } else {
        data.chunks(65535).collect()
    };
    for (i, chunk) in chunks.iter().enumerate() {
        out.push((i + 1 == chunks.len()) as u8); // BFINAL, BTYPE = 00 (stored)
        let len = chunk.len() as u16;
        out.extend(len.to_le_bytes());
        out.extend((!len).to_le_bytes());
        out.extend(*chunk);
    }
    out.extend(crc32(data).to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out
}

/// Images `count x rows x cols` whose pixel values are `(i * 7 + 3) % 256`.
fn pixels(count: usize, rows: usize, cols: usize) -> Vec<u8> {
    (0..count * rows * cols)
        .map(|i| ((i * 7 + 3) % 256) as u8)
        .collect()
}

fn images_file(dir: &Path, name: &str, count: u32, rows: u32, cols: u32) -> PathBuf {
    let px = pixels(count as usize, rows as usize, cols as usize);
    write(dir, name, &idx_bytes(0x08, &[count, rows, cols], &px))
}

fn labels_file(dir: &Path, name: &str, labels: &[u8]) -> PathBuf {
    write(dir, name, &idx_bytes(0x08, &[labels.len() as u32], labels))
}

/// Asserts that `err` is about `path`: `path()` says so and the message
/// names it.
fn names_file(err: &DataError, path: &Path) {
    assert_eq!(err.path(), Some(path), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message does not name {}: {msg}",
        path.display()
    );
}

// ------------------------------------------------------------------ IDX: reading

#[test]
fn idx_images_and_labels_read_back_exactly() {
    let dir = tmp_dir("read-back");
    let images = images_file(&dir, "images", 3, 4, 5);
    let labels = labels_file(&dir, "labels", &[7, 0, 9]);

    let im = read_idx_images(&images).unwrap();
    assert_eq!((im.count, im.rows, im.cols), (3, 4, 5));
    assert_eq!(im.data, pixels(3, 4, 5));
    assert_eq!(im.image(1).unwrap(), &pixels(3, 4, 5)[20..40]);
    assert!(im.image(3).is_none());
    assert_eq!(read_idx_labels(&labels).unwrap(), vec![7, 0, 9]);

    let arr = read_idx(&images).unwrap();
    assert_eq!(arr.dims, vec![3, 4, 5]);
    assert_eq!(arr.data, IdxData::U8(pixels(3, 4, 5)));
}

#[test]
fn idx_reads_every_element_type_big_endian() {
    let dir = tmp_dir("types");
    let check = |name: &str, code: u8, dims: &[u32], payload: Vec<u8>, want: IdxData| {
        let path = write(&dir, name, &idx_bytes(code, dims, &payload));
        let arr = read_idx(&path).unwrap();
        assert_eq!(
            arr.dims,
            dims.iter().map(|&d| d as usize).collect::<Vec<_>>()
        );
        assert_eq!(arr.data.idx_type().code(), code);
        assert_eq!(arr.data, want, "{name}");
    };
    check(
        "i8",
        0x09,
        &[4],
        vec![0x00, 0x7f, 0x80, 0xff],
        IdxData::I8(vec![0, 127, -128, -1]),
    );
    let i16s = [1i16, -2, i16::MAX, i16::MIN, 0x0102];
    check(
        "i16",
        0x0B,
        &[5],
        i16s.iter().flat_map(|v| v.to_be_bytes()).collect(),
        IdxData::I16(i16s.to_vec()),
    );
    let i32s = [1i32, -70000, i32::MAX, i32::MIN, 0x0102_0304, 0];
    check(
        "i32",
        0x0C,
        &[2, 3],
        i32s.iter().flat_map(|v| v.to_be_bytes()).collect(),
        IdxData::I32(i32s.to_vec()),
    );
    let f32s = [0.5f32, -1.25, 3.0e-39, f32::MAX, f32::INFINITY, -0.0];
    check(
        "f32",
        0x0D,
        &[3, 2],
        f32s.iter().flat_map(|v| v.to_be_bytes()).collect(),
        IdxData::F32(f32s.to_vec()),
    );
    let f64s = [0.1f64, -1e300, 5e-324, 2.0];
    check(
        "f64",
        0x0E,
        &[1, 2, 1, 2],
        f64s.iter().flat_map(|v| v.to_be_bytes()).collect(),
        IdxData::F64(f64s.to_vec()),
    );
    check(
        "u8 rank 1",
        0x08,
        &[3],
        vec![1, 2, 255],
        IdxData::U8(vec![1, 2, 255]),
    );
    // Zero items is a valid (empty) file.
    check("empty", 0x0C, &[0, 4], vec![], IdxData::I32(vec![]));
    assert_eq!(
        IdxData::I16(vec![-3, 4]).to_f64_vec(),
        vec![-3.0, 4.0],
        "to_f64_vec"
    );
    assert_eq!(IdxType::from_code(0x0E), Some(IdxType::F64));
    assert_eq!(IdxType::F64.size(), 8);
}

#[test]
fn idx_reads_gzip_files_transparently() {
    let dir = tmp_dir("gzip");
    // Over 65535 bytes, so the stream has several deflate blocks.
    let px = pixels(100, 28, 28);
    let raw = idx_bytes(0x08, &[100, 28, 28], &px);
    let gz = write(&dir, "images.gz", &gzip_stored(&raw));
    let im = read_idx_images(&gz).unwrap();
    assert_eq!((im.count, im.rows, im.cols), (100, 28, 28));
    assert_eq!(im.data, px);

    let f32s = [1.5f32, -2.0];
    let raw = idx_bytes(
        0x0D,
        &[2],
        &f32s
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect::<Vec<_>>(),
    );
    // Detection is by content, not by the name.
    let gz = write(&dir, "floats.idx", &gzip_stored(&raw));
    assert_eq!(read_idx(&gz).unwrap().data, IdxData::F32(f32s.to_vec()));
}

// ------------------------------------------------------------------ IDX: hostile files

#[test]
fn missing_file_is_not_found_and_named() {
    let dir = tmp_dir("missing");
    let path = dir.join("nope-idx3-ubyte");
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }), "{err:?}");
    names_file(&err, &path);
    assert!(err.to_string().ends_with("no such file"), "{err}");
}

#[test]
fn bad_magic_is_reported() {
    let dir = tmp_dir("magic");
    let path = write(&dir, "bad", &[0x01, 0x00, 0x08, 0x01, 0, 0, 0, 0]);
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::BadMagic {
                magic: [1, 0, 8, 1],
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    assert!(err.to_string().contains("01 00 08 01"), "{err}");
    // A text file is not an IDX file either.
    let path = write(&dir, "text", b"hello world");
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, DataError::BadMagic { .. }), "{err:?}");
    names_file(&err, &path);
}

#[test]
fn unsupported_type_code_is_reported() {
    let dir = tmp_dir("type");
    let path = write(&dir, "t", &idx_bytes(0x0A, &[2], &[0, 0]));
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(err, DataError::UnsupportedType { code: 0x0A, .. }),
        "{err:?}"
    );
    names_file(&err, &path);
    assert!(err.to_string().contains("0x0a"), "{err}");
}

#[test]
fn zero_and_absurd_ranks_are_reported() {
    let dir = tmp_dir("rank");
    let path = write(&dir, "rank0", &[0, 0, 0x08, 0]);
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, DataError::BadRank { rank: 0, .. }), "{err:?}");
    names_file(&err, &path);
    let path = write(&dir, "rank200", &[0, 0, 0x08, 200, 0, 0, 0, 1]);
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(err, DataError::BadRank { rank: 200, .. }),
        "{err:?}"
    );
    names_file(&err, &path);
}

#[test]
fn dims_whose_product_overflows_are_reported() {
    let dir = tmp_dir("overflow");
    let big = u32::MAX;
    let path = write(&dir, "o", &idx_bytes(0x0E, &[big, big, big, big], &[]));
    let err = read_idx(&path).unwrap_err();
    match &err {
        DataError::SizeOverflow {
            dims, elem_size, ..
        } => {
            assert_eq!(dims, &vec![big as u64; 4]);
            assert_eq!(*elem_size, 8);
        }
        other => panic!("expected SizeOverflow, got {other:?}"),
    }
    names_file(&err, &path);
}

#[test]
fn huge_declared_size_in_a_small_file_is_truncation_without_allocating() {
    let dir = tmp_dir("huge");
    // Declares (2^32 - 1)^2 bytes, about 18 exabytes, in a 12-byte file: the
    // reader must compare with the file length, not try to allocate.
    let big = u32::MAX;
    let path = write(&dir, "h", &idx_bytes(0x08, &[big, big], &[]));
    let err = read_idx(&path).unwrap_err();
    match err {
        DataError::Truncated {
            what,
            expected,
            found,
            ..
        } => {
            assert_eq!(what, "data");
            assert_eq!(expected, (big as u64) * (big as u64) + 12);
            assert_eq!(found, 12);
        }
        ref other => panic!("expected Truncated, got {other:?}"),
    }
    // The same header gzip-compressed: no length to compare with up front,
    // and still no huge allocation.
    let path = write(
        &dir,
        "h.gz",
        &gzip_stored(&idx_bytes(0x08, &[big, big], &[1, 2, 3])),
    );
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "data",
                found: 15,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
}

#[test]
fn truncated_header_and_data_report_expected_and_found_bytes() {
    let dir = tmp_dir("truncated");
    // Three bytes: not even a magic number.
    let path = write(&dir, "short-magic", &[0, 0, 8]);
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "header",
                expected: 4,
                found: 3,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    // Rank 3 but one dim only.
    let path = write(&dir, "short-dims", &[0, 0, 8, 3, 0, 0, 0, 2]);
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "header",
                expected: 16,
                found: 8,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    // 2 images of 3x3 need 18 data bytes; 17 are there.
    let full = idx_bytes(0x08, &[2, 3, 3], &pixels(2, 3, 3));
    let path = write(&dir, "short-data", &full[..full.len() - 1]);
    let err = read_idx_images(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "data",
                expected: 34,
                found: 33,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    assert!(
        err.to_string().contains("expected 34 bytes, found 33"),
        "{err}"
    );
    // The same in a gzip file.
    let path = write(&dir, "short-data.gz", &gzip_stored(&full[..full.len() - 1]));
    let err = read_idx_images(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "data",
                expected: 34,
                found: 33,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    // A 4-byte i32 element cut in half.
    let path = write(&dir, "short-i32", &idx_bytes(0x0C, &[1], &[0, 0]));
    let err = read_idx(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Truncated {
                what: "data",
                expected: 12,
                found: 10,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn trailing_bytes_are_reported() {
    let dir = tmp_dir("trailing");
    let mut bytes = idx_bytes(0x08, &[2, 3, 3], &pixels(2, 3, 3));
    bytes.extend([9, 9]);
    let path = write(&dir, "t", &bytes);
    let err = read_idx_images(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TrailingBytes {
                expected: 34,
                found: 36,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
    assert!(err.to_string().contains("2 trailing bytes"), "{err}");
    let path = write(&dir, "t.gz", &gzip_stored(&bytes));
    let err = read_idx_images(&path).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::TrailingBytes {
                expected: 34,
                found: 36,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &path);
}

#[test]
fn corrupt_gzip_is_reported() {
    let dir = tmp_dir("corrupt-gz");
    let raw = idx_bytes(0x08, &[2, 3, 3], &pixels(2, 3, 3));
    let mut gz = gzip_stored(&raw);
    let n = gz.len();
    gz[n - 8] ^= 0xff; // the CRC
    let path = write(&dir, "bad-crc.gz", &gz);
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err:?}");
    names_file(&err, &path);
    // Cut in the middle of the deflate stream.
    let gz = gzip_stored(&raw);
    let path = write(&dir, "cut.gz", &gz[..20]);
    let err = read_idx(&path).unwrap_err();
    assert!(matches!(err, DataError::Gzip { .. }), "{err:?}");
    names_file(&err, &path);
}

#[test]
fn images_and_labels_readers_reject_the_other_kind() {
    let dir = tmp_dir("wrong-kind");
    let images = images_file(&dir, "images", 2, 2, 2);
    let labels = labels_file(&dir, "labels", &[1, 2]);
    let err = read_idx_images(&labels).unwrap_err();
    assert!(matches!(err, DataError::WrongContent { .. }), "{err:?}");
    names_file(&err, &labels);
    assert!(err.to_string().contains("found u8 [2]"), "{err}");
    let err = read_idx_labels(&images).unwrap_err();
    assert!(matches!(err, DataError::WrongContent { .. }), "{err:?}");
    names_file(&err, &images);
    let floats = write(&dir, "floats", &idx_bytes(0x0D, &[1, 1, 1], &[0, 0, 0, 0]));
    let err = read_idx_images(&floats).unwrap_err();
    assert!(err.to_string().contains("found f32 [1, 1, 1]"), "{err}");
}

// ------------------------------------------------------------------ MNIST

#[test]
fn mnist_items_are_scaled_pixels_and_labels() {
    let dir = tmp_dir("mnist");
    let images = images_file(&dir, "images", 3, 4, 4);
    let labels = labels_file(&dir, "labels", &[5, 0, 9]);
    let data = Mnist::<(C<1>, C<4>, C<4>)>::load(&images, &labels).unwrap();
    assert_eq!(data.len(), 3);
    assert_eq!((data.rows(), data.cols()), (4, 4));
    assert_eq!(data.labels(), [5, 0, 9]);
    let px = pixels(3, 4, 4);
    for i in 0..3 {
        let (x, y) = data.get(i).unwrap();
        assert_eq!(x.dims()[..], [1, 4, 4]);
        assert_eq!(y, [5, 0, 9][i]);
        let want: Vec<f32> = px[i * 16..(i + 1) * 16]
            .iter()
            .map(|&p| p as f32 / 255.0)
            .collect();
        assert_eq!(x.to_vec(), want);
    }
    assert!(matches!(
        data.get(3),
        Err(DataError::IndexOutOfRange { index: 3, len: 3 })
    ));

    // Exact values ToTensor gives: 0 -> 0, 51 -> 0.2, 255 -> 1; Normalize with
    // mean 0.5, std 0.25 maps them to -2, -1.2, 2.
    let path = write(&dir, "three", &idx_bytes(0x08, &[1, 1, 3], &[0, 51, 255]));
    let one = labels_file(&dir, "one", &[4]);
    let flat = Mnist::<(C<3>,)>::load(&path, &one).unwrap();
    assert_eq!(flat.get(0).unwrap().0.to_vec(), [0.0, 0.2, 1.0]);
    let norm = flat.normalize(0.5, 0.25).unwrap();
    assert_eq!(
        norm.get(0).unwrap().0.to_vec(),
        [-2.0, (0.2f32 - 0.5) / 0.25, 2.0]
    );
    assert!(matches!(
        norm.clone().normalize(0.0, 0.0),
        Err(DataError::Invalid { .. })
    ));
    // Rank-2 item shapes take (rows, cols).
    let grid = Mnist::<(C<1>, C<3>)>::load(&path, &one).unwrap();
    assert_eq!(grid.get(0).unwrap().0.dims()[..], [1, 3]);
}

#[test]
fn mnist_checks_counts_and_shapes_naming_the_files() {
    let dir = tmp_dir("mnist-errors");
    let images = images_file(&dir, "images", 3, 4, 4);
    let labels = labels_file(&dir, "labels", &[1, 2]);
    let err = Mnist::<(C<1>, C<4>, C<4>)>::load(&images, &labels).unwrap_err();
    match &err {
        DataError::CountMismatch {
            images_path,
            images: 3,
            labels_path,
            labels: 2,
        } => {
            assert_eq!(images_path, &images);
            assert_eq!(labels_path, &labels);
        }
        other => panic!("expected CountMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&images.display().to_string()) && msg.contains(&labels.display().to_string()),
        "{msg}"
    );
    // 4x4 images do not fit the default 1x28x28 item shape.
    let labels3 = labels_file(&dir, "labels3", &[1, 2, 3]);
    let err = Mnist::<(C<1>, C<28>, C<28>)>::load(&images, &labels3).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::ImageShape {
                rows: 4,
                cols: 4,
                ..
            }
        ),
        "{err:?}"
    );
    names_file(&err, &images);
    assert!(err.to_string().contains("[1, 28, 28]"), "{err}");
    // Errors in either file are passed through with that file's name.
    let bad = write(&dir, "bad-labels", &[0, 0, 0x08, 1, 0, 0, 0, 9, 1]);
    let err = Mnist::<(C<1>, C<4>, C<4>)>::load(&images, &bad).unwrap_err();
    assert!(matches!(err, DataError::Truncated { .. }), "{err:?}");
    names_file(&err, &bad);
}

#[test]
fn mnist_from_dir_finds_gzip_files_and_batches_through_the_loader() {
    let dir = tmp_dir("mnist-dir");
    let raw_images = idx_bytes(0x08, &[5, 28, 28], &pixels(5, 28, 28));
    let raw_labels = idx_bytes(0x08, &[5], &[3, 1, 4, 1, 5]);
    write(&dir, "t10k-images-idx3-ubyte.gz", &gzip_stored(&raw_images));
    write(&dir, "t10k-labels-idx1-ubyte", &raw_labels);
    let test = Mnist::<(C<1>, C<28>, C<28>)>::from_dir(&dir, MnistSplit::Test).unwrap();
    assert_eq!(test.labels(), [3, 1, 4, 1, 5]);

    let err = Mnist::<(C<1>, C<28>, C<28>)>::from_dir(&dir, MnistSplit::Train).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("train-images-idx3-ubyte"), "{err}");

    let mut loader = DataLoader::new(test, 2).unwrap();
    let batches: Vec<(Tensor<(Dyn, C<1>, C<28>, C<28>)>, Tensor<(Dyn,), i64>)> =
        loader.iter().map(Result::unwrap).collect();
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[0].0.dims()[..], [2, 1, 28, 28]);
    assert_eq!(batches[2].0.dims()[..], [1, 1, 28, 28]);
    let labels: Vec<i64> = batches.iter().flat_map(|b| b.1.to_vec()).collect();
    assert_eq!(labels, [3, 1, 4, 1, 5]);
    let x0 = batches[1].0.to_vec();
    let px = pixels(5, 28, 28);
    assert_eq!(x0[784], px[3 * 784] as f32 / 255.0); // item 3 is row 1 of batch 1
}

// ------------------------------------------------------------------ datasets

#[test]
fn vec_boxed_tensor_and_subset_datasets() {
    let v = vec!["a", "b", "c"];
    assert_eq!(Dataset::len(&v), 3);
    assert_eq!(Dataset::get(&v, 2).unwrap(), "c");
    assert!(matches!(
        Dataset::get(&v, 3),
        Err(DataError::IndexOutOfRange { index: 3, len: 3 })
    ));
    // Datasets and errors cross threads (loader workers, `?` into
    // `Box<dyn Error + Send + Sync>`).
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<DataError>();
    send_sync::<Mnist>();
    send_sync::<DataLoader<TensorDataset<(C<3>,)>>>();
    let boxed: Box<dyn Dataset<Item = &str>> = Box::new(v);
    assert_eq!(boxed.get(1).unwrap(), "b");

    let x =
        Tensor::<(Dyn, C<2>, C<2>)>::from_vec((0..12).map(|v| v as f32).collect(), (Dyn(3), C, C))
            .unwrap();
    let y = Tensor::<(Dyn,), i64>::from_vec(vec![10, 11, 12], (Dyn(3),)).unwrap();
    let data = TensorDataset::new(&x, &y).unwrap();
    let (row, label): (Tensor<(C<2>, C<2>)>, i64) = data.get(2).unwrap();
    assert_eq!(row.to_vec(), [8., 9., 10., 11.]);
    assert_eq!(label, 12);
    assert!(
        row.shares_storage(&data.get(0).unwrap().0),
        "items are views"
    );
    let short = Tensor::<(Dyn,), i64>::from_vec(vec![1, 2], (Dyn(2),)).unwrap();
    assert!(matches!(
        TensorDataset::new(&x, &short),
        Err(DataError::Invalid { .. })
    ));
    let host = TensorDataset::<(C<2>,)>::from_vec(vec![1., 2., 3., 4.], (C,), vec![0, 1]).unwrap();
    assert_eq!(host.get(1).unwrap().0.to_vec(), [3., 4.]);
    assert!(TensorDataset::<(C<2>,)>::from_vec(vec![1., 2., 3.], (C,), vec![0, 1]).is_err());

    let sub = Subset::new(Arc::new(data), vec![2, 0]).unwrap();
    assert_eq!(sub.len(), 2);
    assert_eq!(sub.get(0).unwrap().1, 12);
    assert_eq!(sub.get(1).unwrap().1, 10);
    assert!(sub.get(2).is_err());
    assert!(matches!(
        Subset::new(Arc::clone(sub.dataset()), vec![0, 3]),
        Err(DataError::IndexOutOfRange { index: 3, len: 3 })
    ));
}

#[test]
fn random_split_partitions_reproducibly() {
    let all: Arc<Vec<u32>> = Arc::new((0..50).collect());
    let items =
        |s: &Subset<Vec<u32>>| -> Vec<u32> { (0..s.len()).map(|i| s.get(i).unwrap()).collect() };
    let a = random_split(Arc::clone(&all), &[30, 15, 5], 9).unwrap();
    let b = random_split(Arc::clone(&all), &[30, 15, 5], 9).unwrap();
    let c = random_split(Arc::clone(&all), &[30, 15, 5], 10).unwrap();
    assert_eq!(a.iter().map(Subset::len).collect::<Vec<_>>(), [30, 15, 5]);
    let mut union: Vec<u32> = a.iter().flat_map(&items).collect();
    assert_ne!(union, (0..50).collect::<Vec<_>>(), "the split is shuffled");
    union.sort();
    assert_eq!(union, (0..50).collect::<Vec<_>>(), "a partition");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(items(x), items(y), "same seed, same split");
    }
    assert_ne!(items(&a[0]), items(&c[0]), "another seed, another split");
    assert!(matches!(
        random_split(all, &[30, 30], 9),
        Err(DataError::SplitLengths {
            sum: 60,
            len: 50,
            ..
        })
    ));
    // PyTorch's rule for fractions: floors, then the remainder round-robin.
    assert_eq!(split_lengths(10, &[0.3, 0.3, 0.4]).unwrap(), [3, 3, 4]);
    assert_eq!(split_lengths(11, &[0.5, 0.5]).unwrap(), [6, 5]);
    assert_eq!(
        split_lengths(7, &[0.25, 0.25, 0.25, 0.25]).unwrap(),
        [2, 2, 2, 1]
    );
    assert!(split_lengths(10, &[0.5, 0.6]).is_err());
}

// ------------------------------------------------------------------ DataLoader

/// A loader over the indices themselves, batches kept as plain vectors.
fn index_loader(
    n: usize,
    batch: usize,
) -> DataLoader<Vec<usize>, impl Fn(Vec<usize>) -> Result<Vec<usize>, DataError>> {
    DataLoader::new((0..n).collect::<Vec<usize>>(), batch)
        .unwrap()
        .collate(|v: Vec<usize>| Ok(v))
}

fn epoch_batches<C>(loader: &mut DataLoader<Vec<usize>, C>) -> Vec<Vec<usize>>
where
    C: forma::nn::data::Collate<usize, Batch = Vec<usize>> + 'static,
{
    loader.iter().map(Result::unwrap).collect()
}

#[test]
fn batch_sizes_and_drop_last() {
    let mut l = index_loader(10, 4);
    assert_eq!(l.len(), 3);
    let b = epoch_batches(&mut l);
    assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 2]);
    assert_eq!(
        b.concat(),
        (0..10).collect::<Vec<_>>(),
        "no shuffle: in order"
    );

    let mut l = index_loader(10, 4).drop_last(true);
    assert_eq!(l.len(), 2);
    assert_eq!(epoch_batches(&mut l), [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);

    let mut l = index_loader(8, 4).drop_last(true);
    assert_eq!(
        epoch_batches(&mut l).len(),
        2,
        "an exact multiple drops nothing"
    );
    let mut l = index_loader(3, 4).drop_last(true);
    assert!(l.is_empty());
    assert!(epoch_batches(&mut l).is_empty());
    assert_eq!(l.state().epoch, 1, "an empty epoch still counts");
    assert!(matches!(
        DataLoader::new(vec![1u8], 0),
        Err(DataError::Invalid { .. })
    ));
}

#[test]
fn shuffled_epochs_cover_every_index_once_and_replay_from_the_seed() {
    let mut a = index_loader(23, 5).shuffle(1234);
    let mut b = index_loader(23, 5).shuffle(1234);
    let mut c = index_loader(23, 5).shuffle(4321);
    let mut orders = Vec::new();
    for epoch in 0..4u64 {
        assert_eq!(a.state(), LoaderState { epoch, batch: 0 });
        let ea = epoch_batches(&mut a).concat();
        let eb = epoch_batches(&mut b).concat();
        let ec = epoch_batches(&mut c).concat();
        let mut sorted = ea.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..23).collect::<Vec<_>>(),
            "epoch {epoch}: each index once"
        );
        assert_eq!(ea, eb, "same seed, same order");
        assert_ne!(ea, ec, "another seed, another order");
        assert_eq!(ea, a.indices(epoch), "indices(epoch) is the epoch's order");
        orders.push(ea);
    }
    for i in 0..orders.len() {
        for j in 0..i {
            assert_ne!(orders[i], orders[j], "epochs {j} and {i} share an order");
        }
    }
    // With drop_last the kept batches still hold distinct indices.
    let mut d = index_loader(23, 5).shuffle(1234).drop_last(true);
    let kept = epoch_batches(&mut d).concat();
    assert_eq!(kept.len(), 20);
    assert_eq!(kept, orders[0][..20], "drop_last keeps the same order");
}

/// A dataset whose item 0 is slow, so with workers batch 0 finishes last;
/// the collate logs which batch (by its first item) finished when.
struct SlowFirst(usize);

impl Dataset for SlowFirst {
    type Item = usize;
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, index: usize) -> Result<usize, DataError> {
        if index == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(index * 10)
    }
}

#[test]
fn workers_keep_the_order_of_batches() {
    let finished = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&finished);
    let mut parallel = DataLoader::new(SlowFirst(12), 3)
        .unwrap()
        .num_workers(3)
        .collate(move |v: Vec<usize>| {
            log.lock().unwrap().push(v[0]);
            Ok(v)
        });
    let mut serial = DataLoader::new(SlowFirst(12), 3)
        .unwrap()
        .collate(|v: Vec<usize>| Ok(v));
    let p: Vec<Vec<usize>> = parallel.iter().map(Result::unwrap).collect();
    let s: Vec<Vec<usize>> = serial.iter().map(Result::unwrap).collect();
    assert_eq!(p, s);
    assert_eq!(p.concat(), (0..12).map(|i| i * 10).collect::<Vec<_>>());
    // The workers really did finish out of order: batch 0 was not first.
    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.len(), 4);
    assert_ne!(finished[0], 0, "completion order {finished:?}");
}

#[test]
fn workers_give_the_same_tensor_batches_as_the_main_thread() {
    let n = 37;
    let x =
        Tensor::<(Dyn, C<3>)>::from_vec((0..n * 3).map(|v| v as f32 * 0.5).collect(), (Dyn(n), C))
            .unwrap();
    let y = Tensor::<(Dyn,), i64>::from_vec((0..n as i64).collect(), (Dyn(n),)).unwrap();
    let run = |workers: usize| {
        let data = TensorDataset::new(&x, &y).unwrap();
        let mut l = DataLoader::new(data, 5)
            .unwrap()
            .shuffle(99)
            .num_workers(workers)
            .prefetch_factor(1);
        let mut out = Vec::new();
        for _ in 0..2 {
            for batch in l.iter() {
                let (xb, yb): (Tensor<(Dyn, C<3>)>, Tensor<(Dyn,), i64>) = batch.unwrap();
                out.push((xb.dims().to_vec(), xb.to_vec(), yb.to_vec()));
            }
        }
        out
    };
    let serial = run(0);
    assert_eq!(serial.len(), 16);
    assert_eq!(serial[7].0, [2, 3], "the last batch of an epoch is short");
    for (_, xs, ys) in &serial {
        for (row, &label) in xs.chunks(3).zip(ys) {
            let l = label as f32;
            assert_eq!(row, [l * 1.5, l * 1.5 + 0.5, l * 1.5 + 1.0]);
        }
    }
    for workers in [1, 2, 4] {
        assert_eq!(run(workers), serial, "{workers} workers");
    }
}

#[test]
fn custom_collate_is_used() {
    let mut l = DataLoader::new(vec![1.0f64, 2.0, 3.0, 4.0, 5.0], 2)
        .unwrap()
        .num_workers(2)
        .collate(|items: Vec<f64>| Ok(items.iter().sum::<f64>()));
    let sums: Vec<f64> = l.iter().map(Result::unwrap).collect();
    assert_eq!(sums, [3.0, 7.0, 5.0]);

    // The default collate batches numbers into a tensor.
    let mut l = DataLoader::new(vec![1.0f64, 2.0, 3.0], 2).unwrap();
    let b: Vec<Tensor<(Dyn,), f64>> = l.iter().map(Result::unwrap).collect();
    assert_eq!(b[0].to_vec(), [1.0, 2.0]);
    assert_eq!(b[1].to_vec(), [3.0]);

    // A collate error reaches the caller as that batch's error.
    let mut l = DataLoader::new(vec![1u8, 2, 3], 1)
        .unwrap()
        .collate(|items: Vec<u8>| {
            if items[0] == 2 {
                Err(DataError::other("two is not allowed"))
            } else {
                Ok(items[0])
            }
        });
    let out: Vec<Result<u8, DataError>> = l.iter().collect();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].as_ref().unwrap(), &1);
    assert_eq!(
        out[1].as_ref().unwrap_err().to_string(),
        "two is not allowed"
    );
    assert_eq!(out[2].as_ref().unwrap(), &3);
}

#[test]
fn stopping_and_restoring_the_position_resumes_exactly() {
    for workers in [0, 3] {
        let make = || index_loader(17, 4).shuffle(5).num_workers(workers);
        // Uninterrupted: three epochs.
        let mut full = make();
        let mut all = Vec::new();
        for _ in 0..3 {
            all.extend(epoch_batches(&mut full));
        }
        assert_eq!(all.len(), 15);

        // Interrupted after epoch 0 and two batches of epoch 1 (7 batches).
        let mut first = make();
        let mut seen = epoch_batches(&mut first);
        let saved = {
            let mut it = first.iter();
            seen.push(it.next().unwrap().unwrap());
            seen.push(it.next().unwrap().unwrap());
            it.state()
        };
        assert_eq!(saved, LoaderState { epoch: 1, batch: 2 });
        assert_eq!(first.state(), saved);
        assert_eq!(seen, all[..7]);

        // A fresh loader restored to that position continues with batch 7.
        let mut resumed = make();
        resumed.set_state(saved).unwrap();
        let mut rest = epoch_batches(&mut resumed);
        assert_eq!(resumed.state(), LoaderState { epoch: 2, batch: 0 });
        rest.extend(epoch_batches(&mut resumed));
        assert_eq!(rest, all[7..], "{workers} workers");
    }
    let mut l = index_loader(17, 4);
    assert!(matches!(
        l.set_state(LoaderState { epoch: 0, batch: 5 }),
        Err(DataError::BadState { batch: 5, len: 5 })
    ));
    assert_eq!(
        l.state(),
        LoaderState::default(),
        "a rejected state changes nothing"
    );
}

/// Counts how often each item is fetched.
struct Counting(Vec<AtomicUsize>);

impl Dataset for Counting {
    type Item = usize;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> Result<usize, DataError> {
        self.0[index].fetch_add(1, Ordering::SeqCst);
        Ok(index)
    }
}

#[test]
fn each_epoch_fetches_each_item_exactly_once() {
    for workers in [0, 2] {
        let counting = Counting((0..29).map(|_| AtomicUsize::new(0)).collect());
        let mut l = DataLoader::new(counting, 4)
            .unwrap()
            .shuffle(3)
            .num_workers(workers)
            .collate(|v: Vec<usize>| Ok(v));
        for epoch in 1..=3 {
            let n: usize = l.iter().map(|b| b.unwrap().len()).sum();
            assert_eq!(n, 29);
            let counts: Vec<usize> = l
                .dataset()
                .0
                .iter()
                .map(|c| c.load(Ordering::SeqCst))
                .collect();
            assert_eq!(
                counts,
                vec![epoch; 29],
                "{workers} workers, after epoch {epoch}"
            );
        }
    }
}

/// Fails on one item and panics on another.
struct Faulty;

impl Dataset for Faulty {
    type Item = u32;
    fn len(&self) -> usize {
        6
    }
    fn get(&self, index: usize) -> Result<u32, DataError> {
        match index {
            2 => Err(DataError::other("item 2 is corrupt")),
            4 => panic!("item 4 exploded"),
            i => Ok(i as u32),
        }
    }
}

#[test]
fn item_errors_and_worker_panics_are_batch_errors() {
    let mut l = DataLoader::new(Faulty, 2)
        .unwrap()
        .num_workers(2)
        .collate(|v: Vec<u32>| Ok(v));
    let out: Vec<Result<Vec<u32>, DataError>> = l.iter().collect();
    assert_eq!(out.len(), 3);
    assert_eq!(out[0].as_ref().unwrap(), &[0, 1]);
    assert_eq!(
        out[1].as_ref().unwrap_err().to_string(),
        "item 2 is corrupt"
    );
    match &out[2] {
        Err(DataError::WorkerPanic { batch: 2, message }) => {
            assert_eq!(message, "item 4 exploded")
        }
        other => panic!("expected WorkerPanic, got {other:?}"),
    }
    assert_eq!(l.state(), LoaderState { epoch: 1, batch: 0 });
}

#[test]
fn dropping_an_iterator_early_keeps_the_position() {
    let mut l = index_loader(20, 2).shuffle(8).num_workers(2);
    let order = l.indices(0);
    let first: Vec<Vec<usize>> = l.iter().take(3).map(Result::unwrap).collect();
    assert_eq!(first.concat(), order[..6]);
    assert_eq!(l.state(), LoaderState { epoch: 0, batch: 3 });
    let rest: Vec<Vec<usize>> = l.iter().map(Result::unwrap).collect();
    assert_eq!(rest.concat(), order[6..]);
    assert_eq!(l.state(), LoaderState { epoch: 1, batch: 0 });
}

#[test]
fn a_tensor_dataset_takes_regression_targets_of_any_shape() {
    // Five items of two features; targets of shape (N,) (scalars) and
    // (N, 2) f64 rows, as `TensorDataset(x, y)` takes any target tensor.
    let x =
        Tensor::<(Dyn, C<2>)>::from_vec((0..10).map(|v| v as f32).collect(), (Dyn(5), C)).unwrap();
    let y = Tensor::<(Dyn,)>::from_vec(vec![0.5, 1.5, 2.5, 3.5, 4.5], (Dyn(5),)).unwrap();
    let data = TensorDataset::with_targets(&x, &y).unwrap();
    assert_eq!(data.len(), 5);
    let (row, target): (Tensor<(C<2>,)>, Tensor<()>) = data.get(3).unwrap();
    assert_eq!((row.to_vec(), target.to_vec()), (vec![6., 7.], vec![3.5]));
    assert!(matches!(
        data.get(5),
        Err(DataError::IndexOutOfRange { index: 5, len: 5 })
    ));
    // Batches stack the targets: (B,) for scalar targets.
    let mut loader = DataLoader::new(data, 2).unwrap();
    let batches: Vec<(Tensor<(Dyn, C<2>)>, Tensor<(Dyn,)>)> =
        loader.iter().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 3);
    assert_eq!(batches[1].1.to_vec(), [2.5, 3.5]);
    assert_eq!(batches[2].0.to_vec(), [8., 9.]);

    let y2 = Tensor::<(Dyn, C<2>), f64>::from_vec((0..10).map(f64::from).collect(), (Dyn(5), C))
        .unwrap();
    let data = TensorDataset::with_targets(&x, &y2).unwrap();
    let (_, target): (_, Tensor<(C<2>,), f64>) = data.get(4).unwrap();
    assert_eq!(target.to_vec(), [8., 9.]);
    let short = Tensor::<(Dyn,)>::from_vec(vec![1., 2.], (Dyn(2),)).unwrap();
    let err = TensorDataset::with_targets(&x, &short).unwrap_err();
    assert!(
        err.to_string().contains("5 feature rows but 2 target rows"),
        "{err}"
    );
}
