//! `Dropout`, like `nn.Dropout(p)`.

use crate::module::py_float;
use crate::{Forward, Training};
use forma_core::device::Device;
use forma_core::{Dyn, Float, Result, Rng, Shape, Tensor};
use forma_macros::Module;
use std::sync::Mutex;

/// Zeroes each element with probability `p` in training mode and scales the
/// rest by `1 / (1 - p)`; the identity in eval mode, like `nn.Dropout(p)`.
/// Its masks come from its own generator, seeded at construction, so a run is
/// reproducible.
#[derive(Module, Clone, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Dropout {
    /// Probability of zeroing an element.
    pub p: f64,
    /// Train/eval mode.
    pub training: Training,
    #[module(skip)]
    rng: DropoutRng,
}

impl Dropout {
    /// A dropout layer with probability `p`, its masks drawn from a generator
    /// seeded from `rng`.
    ///
    /// # Panics
    /// If `p` is outside `[0, 1]`.
    pub fn new(p: f64, rng: &mut Rng) -> Self {
        assert!((0.0..=1.0).contains(&p), "Dropout: p={p} must be in [0, 1]");
        Dropout {
            p,
            training: Training::default(),
            rng: DropoutRng::new(rng),
        }
    }

    fn extra_repr(&self) -> String {
        format!("p={}, inplace=False", py_float(self.p))
    }
}

impl<S: Shape, E: Float, D: Device<E>> Forward<Tensor<S, E, D>, Tensor<S, E, D>> for Dropout {
    fn try_forward(&self, x: Tensor<S, E, D>) -> forma_core::Result<Tensor<S, E, D>> {
        if !self.training.is_on() || self.p == 0.0 {
            return Ok(x);
        }
        self.rng.apply(x, self.p)
    }
}

/// The masks of [`Dropout`] and of layers that apply dropout without a
/// `Dropout` child (PyTorch's attention weights, the dropout between
/// recurrent layers): drawn from the layer's own generator, seeded at
/// construction. A clone continues from a copy of the generator.
pub(crate) struct DropoutRng(Mutex<Rng>);

impl DropoutRng {
    pub(crate) fn new(rng: &mut Rng) -> Self {
        DropoutRng(Mutex::new(Rng::seed_from(rng.next_u64())))
    }

    /// Zeroes each element with probability `p` and scales the rest by
    /// `1 / (1 - p)`, like `F.dropout(x, p, training=True)`.
    pub(crate) fn apply<S: Shape, E: Float, D: Device<E>>(
        &self,
        x: Tensor<S, E, D>,
        p: f64,
    ) -> Result<Tensor<S, E, D>> {
        if p == 0.0 {
            return Ok(x);
        }
        // A random mask drawn at capture would be frozen into the graph.
        forma_core::graph::refuse(
            "dropout",
            "dropout in training mode is random and has no graph form: call `.eval()` first",
        );
        let keep = 1.0 - p;
        let scale = if keep > 0.0 { 1.0 / keep } else { 0.0 };
        let mask: Vec<E> = {
            let mut rng = self.0.lock().unwrap_or_else(|e| e.into_inner());
            (0..x.numel())
                .map(|_| E::from_f64(if rng.uniform() < keep { scale } else { 0.0 }))
                .collect()
        };
        let flat = x.flatten_all();
        let mask = Tensor::from_vec_on(mask, (Dyn(flat.numel()),), x.device())?;
        (&flat * &mask).try_reshape_to(x.shape())
    }
}

impl Clone for DropoutRng {
    fn clone(&self) -> Self {
        let rng = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        DropoutRng(Mutex::new(rng))
    }
}

impl std::fmt::Debug for DropoutRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DropoutRng")
    }
}

/// Asserts a dropout probability is in `[0, 1]`, as PyTorch's constructors do.
pub(crate) fn check_dropout(layer: &str, p: f64) {
    assert!(
        (0.0..=1.0).contains(&p),
        "{layer}: dropout probability has to be between 0 and 1, but got {p}"
    );
}

impl crate::shape_step::ShapeStep for Dropout {
    const STEP: crate::shape_step::Step = crate::shape_step::Step::same("Dropout");
}
