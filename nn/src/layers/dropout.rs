//! `Dropout`, like `nn.Dropout(p)`.

use super::norm::py_float;
use crate::{Forward, Training};
use forma_core::device::Device;
use forma_core::{Dyn, Float, Rng, Shape, Tensor};
use forma_macros::Module;
use std::sync::Mutex;

/// Zeroes each element with probability `p` in training mode and scales the
/// rest by `1 / (1 - p)`; the identity in eval mode, like `nn.Dropout(p)`.
/// Its masks come from its own generator, seeded at construction, so a run is
/// reproducible.
#[derive(Module, Debug)]
#[module(crate = "crate", extra_repr = "Self::extra_repr")]
pub struct Dropout {
    /// Probability of zeroing an element.
    pub p: f64,
    /// Train/eval mode.
    pub training: Training,
    #[module(skip)]
    rng: Mutex<Rng>,
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
            rng: Mutex::new(Rng::seed_from(rng.next_u64())),
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
        let keep = 1.0 - self.p;
        let scale = if keep > 0.0 { 1.0 / keep } else { 0.0 };
        let mask: Vec<E> = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            (0..x.numel())
                .map(|_| E::from_f64(if rng.uniform() < keep { scale } else { 0.0 }))
                .collect()
        };
        let flat = x.flatten_all();
        let mask = Tensor::from_vec_on(mask, (Dyn(flat.numel()),), x.device())?;
        (&flat * &mask).try_reshape_to(x.shape())
    }
}
