//! The typed model behind the service: the training example's
//! [`Cnn`], loaded from its checkpoint and run in inference mode.

use crate::config::Normalization;
use crate::error::ServeError;
use forma::core::tape::no_grad;
use forma::prelude::*;
use forma_examples::digits::{CLASSES, PIXELS};
use forma_examples::train::{Cnn, Images, Logits};
use serde::Serialize;
use std::path::Path;

/// One image's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The most likely class (the first on a tie, like `torch.argmax`).
    pub class: usize,
    /// Softmax of the logits, one per class.
    pub probabilities: Vec<f32>,
    /// The model's raw class scores.
    pub logits: Vec<f32>,
}

/// A [`Cnn`] in eval mode with the normalisation its training used, safe to
/// share between threads behind an `Arc`.
#[derive(Debug)]
pub struct Classifier {
    model: Cnn,
    normalization: Normalization,
}

// The service hands one model to many threads (`Arc<Classifier>` moved into
// blocking tasks): if a Forma change made tensors `!Send` or `!Sync` (an `Rc`
// or a `Cell` in the tape), this stops the build here rather than at a
// distant `spawn_blocking` bound.
const _: () = {
    const fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Cnn>();
    send_sync::<Classifier>();
};

impl Classifier {
    /// Wraps `model`, switching it to eval mode (no dropout, running
    /// statistics in normalisation layers), as `model.eval()` does.
    pub fn new(mut model: Cnn, normalization: Normalization) -> Self {
        model.eval();
        Classifier {
            model,
            normalization,
        }
    }

    /// Loads the weights at `path` strictly (every key present, none extra,
    /// every shape equal), as `train` saves them in `best.safetensors`.
    ///
    /// # Errors
    /// [`ServeError::Checkpoint`] naming the file and what is wrong; no
    /// model is returned, so nothing can serve half-loaded weights.
    pub fn load(path: impl AsRef<Path>, normalization: Normalization) -> Result<Self, ServeError> {
        // The initial values are overwritten by a strict load, or the model
        // is dropped: the seed does not matter.
        let mut model = Cnn::new(&mut Rng::seed_from(0));
        model.load_safetensors(path)?;
        Ok(Classifier::new(model, normalization))
    }

    /// The underlying model.
    pub fn model(&self) -> &Cnn {
        &self.model
    }

    /// The normalisation applied to inputs.
    pub fn normalization(&self) -> Normalization {
        self.normalization
    }

    /// Replaces the normalisation applied to inputs.
    pub fn set_normalization(&mut self, normalization: Normalization) {
        self.normalization = normalization;
    }

    /// Predicts every image in `pixels` (row after row of
    /// [`PIXELS`] values in `0..=1`) with one forward pass.
    ///
    /// Runs under [`no_grad`]: Forma's grad mode is per thread (like
    /// PyTorch's), so the guard is taken here, on whichever thread runs the
    /// forward, rather than once at startup on another.
    ///
    /// # Errors
    /// [`forma::Error::InvalidArgument`] when `pixels` is empty or not a
    /// whole number of images; what the model's forward returns (with the
    /// path of the layer that raised it); a backend failure.
    pub fn try_predict(&self, pixels: &[f32]) -> forma::Result<Vec<Prediction>> {
        if pixels.is_empty() || !pixels.len().is_multiple_of(PIXELS) {
            return Err(forma::Error::invalid(
                "predict",
                format!(
                    "{} values are not a whole number of {PIXELS}-pixel images",
                    pixels.len()
                ),
            ));
        }
        let n = pixels.len() / PIXELS;
        let Normalization { mean, std } = self.normalization;
        let values: Vec<f32> = pixels.iter().map(|&p| (p - mean) / std).collect();
        let _no_grad = no_grad();
        let x = Images::from_vec(values, (Dyn(n), C, C, C))?;
        let logits: Logits = self.model.try_forward(x)?;
        let probs = logits.softmax::<1>().try_to_vec()?;
        let classes = logits.argmax::<1>().try_to_vec()?;
        let logits = logits.try_to_vec()?;
        Ok((0..n)
            .map(|i| Prediction {
                class: classes[i] as usize,
                probabilities: probs[i * CLASSES..(i + 1) * CLASSES].to_vec(),
                logits: logits[i * CLASSES..(i + 1) * CLASSES].to_vec(),
            })
            .collect())
    }

    /// [`Classifier::try_predict`] for callers that treat an error as a bug.
    ///
    /// # Panics
    /// Where `try_predict` returns an error.
    #[track_caller]
    pub fn predict(&self, pixels: &[f32]) -> Vec<Prediction> {
        match self.try_predict(pixels) {
            Ok(p) => p,
            Err(e) => panic!("predict: {e}"),
        }
    }
}
