//! Finite-difference gradient checking, like `torch.autograd.gradcheck`.

use crate::device::Device;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Tolerances for [`gradcheck`]: an element passes when
/// `|analytic - numeric| <= atol + rtol * |numeric|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradcheckOptions {
    /// Finite-difference step.
    pub eps: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Default for GradcheckOptions {
    /// PyTorch's defaults: `eps = 1e-6`, `atol = 1e-5`, `rtol = 1e-3`.
    fn default() -> Self {
        GradcheckOptions {
            eps: 1e-6,
            atol: 1e-5,
            rtol: 1e-3,
        }
    }
}

/// Compares the tape's gradient of the scalar function `f` at `x` with
/// central finite differences in f64.
///
/// ```
/// use forma::prelude::*;
/// use forma::core::tape::{gradcheck, GradcheckOptions};
/// let x = Tensor::<(C<3>,), f64>::from_vec(vec![0.5, -1.0, 2.0], (C,)).unwrap();
/// gradcheck(&x, |x| x.tanh().sum_all(), GradcheckOptions::default()).unwrap();
/// ```
///
/// # Errors
/// A message naming the first element whose gradients disagree (with both
/// values), or saying that `f` does not depend on `x` through the tape.
pub fn gradcheck<S: Shape, D: Device<f64>>(
    x: &Tensor<S, f64, D>,
    f: impl Fn(&Tensor<S, f64, D>) -> Tensor<(), f64, D>,
    opts: GradcheckOptions,
) -> Result<(), String> {
    let leaf = x.detach().contiguous().detach().requires_grad();
    let y = f(&leaf);
    if !y.needs_grad() {
        return Err("the function's output does not depend on its input through the tape".into());
    }
    y.try_backward().map_err(|e| e.to_string())?;
    let analytic = leaf
        .grad()
        .map_or_else(|| vec![0.0; x.numel()], |g| g.to_vec());
    let _guard = super::no_grad();
    let base = leaf.to_vec();
    let eval = |v: Vec<f64>| -> Result<f64, String> {
        let t = Tensor::from_vec_on(v, x.shape(), x.device()).map_err(|e| e.to_string())?;
        Ok(f(&t).item())
    };
    for i in 0..base.len() {
        let mut plus = base.clone();
        plus[i] += opts.eps;
        let mut minus = base.clone();
        minus[i] -= opts.eps;
        let numeric = (eval(plus)? - eval(minus)?) / (2.0 * opts.eps);
        let a = analytic[i];
        // Written so that a NaN on either side fails the check.
        let close = (a - numeric).abs() <= opts.atol + opts.rtol * numeric.abs();
        if !close {
            return Err(format!(
                "gradient mismatch at element {i} of {:?}: analytic {a}, numeric {numeric}",
                x.dims()
            ));
        }
    }
    Ok(())
}
