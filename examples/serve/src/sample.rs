//! `--dump-sample`: a real MNIST test digit as a ready-to-send
//! `POST /predict` body, for a first request that is not made up.
//!
//! The digit comes from the MNIST test files (`t10k-images-idx3-ubyte` and
//! `t10k-labels-idx1-ubyte`, plain or `.gz`) in the directory the training
//! example downloads to (`train -- --download`, [`default_cache_dir`]).
//! Its pixels are written as the service takes them: 784 values in `0..=1`
//! (`byte / 255`), row by row; the service normalises them itself.
//!
//! [`default_cache_dir`]: forma_examples::download::default_cache_dir

use crate::error::ServeError;
use forma::nn::data::{DataError, Mnist, MnistSplit};
use forma::prelude::*;
use std::path::{Path, PathBuf};

/// One MNIST test image and its label.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its index in the test set.
    pub index: usize,
    /// The digit it shows.
    pub label: u8,
    /// 784 values in `0..=1`, row by row.
    pub pixels: Vec<f32>,
}

/// The command that fetches MNIST into `dir`.
fn fetch_command(dir: &Path) -> String {
    let mut cmd = "cargo run --release -p forma-examples --example train -- --download".to_string();
    if dir != forma_examples::download::default_cache_dir() {
        cmd.push_str(&format!(" --cache {}", dir.display()));
    }
    cmd
}

impl Sample {
    /// Test image `index` of the MNIST files in `dir`.
    ///
    /// # Errors
    /// [`ServeError::NoMnist`] when the files are not there (its message
    /// gives the command that fetches them), [`ServeError::Mnist`] when they
    /// cannot be read, [`ServeError::SampleIndex`] past the last image.
    pub fn from_mnist_test(dir: impl AsRef<Path>, index: usize) -> Result<Self, ServeError> {
        let dir = dir.as_ref();
        let test = Mnist::<(C<1>, C<28>, C<28>)>::from_dir(dir, MnistSplit::Test).map_err(|e| {
            let (dir, source) = (dir.to_path_buf(), Box::new(e));
            match *source {
                DataError::NotFound { .. } => ServeError::NoMnist {
                    fetch: fetch_command(&dir),
                    dir,
                    source,
                },
                _ => ServeError::Mnist { dir, source },
            }
        })?;
        let len = test.labels().len();
        let (Some(bytes), Some(&label)) = (test.pixels(index), test.labels().get(index)) else {
            return Err(ServeError::SampleIndex { index, len });
        };
        Ok(Sample {
            index,
            label,
            pixels: bytes.iter().map(|&b| f32::from(b) / 255.0).collect(),
        })
    }

    /// The body of a `POST /predict` request for this image:
    /// `{"pixels": [...]}`.
    pub fn request_body(&self) -> String {
        serde_json::json!({ "pixels": self.pixels }).to_string()
    }

    /// Writes [`Sample::request_body`] to `path`.
    ///
    /// # Errors
    /// [`ServeError::Write`] naming the file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ServeError> {
        let path = path.as_ref();
        std::fs::write(path, self.request_body() + "\n").map_err(|source| ServeError::Write {
            path: PathBuf::from(path),
            source,
        })
    }
}
