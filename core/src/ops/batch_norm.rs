//! Batch normalisation with the batch's statistics (training mode), as one
//! op on the tape, like `F.batch_norm(x, .., training=True)`.
//!
//! The input is viewed as `[n, c, l]` (`l` the positions: `h * w` of an
//! image batch, 1 for `[n, c]`). Written as composed ops, batch norm makes
//! about seven passes over the tensor forward (means, the centred copy, its
//! square, the normalisation, the scale, the shift) and several times that
//! backward, each allocating a tensor. Here the forward makes three: the
//! per-channel sum, the sum of squared deviations (the two-pass variance,
//! accurate where the one-pass `E[x^2] - E[x]^2` cancels), and the output; the
//! backward three, as cuDNN's and PyTorch's CPU kernel: the per-channel sums
//! of `g` and `g * xhat`, then
//! `dx = weight * rstd * (g - mean(g) - xhat * mean(g * xhat))` with
//! `xhat = (x - mean) * rstd`, `dweight = sum(g * xhat)`, `dbias = sum(g)`.
//! The passes are existing ops (reductions over the last axis,
//! [`fused`](crate::ops::fused::fused) expressions), so every backend runs
//! it with no kernel of its own.

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{fmt_dims, Error, Result};
use crate::ops::fused::try_fused;
use crate::ops::unary::UnaryExprs;
use crate::shape::{Dyn, One};
use crate::tape::util::reshape;
use crate::tape::{no_grad, Raw};
use crate::tensor::Tensor;

/// The op's name, for errors and the tape.
const NAME: &str = "batch_norm";

/// A per-channel vector viewed as `[1, c, 1]`.
type PerChannel<E, D> = Tensor<(One, Dyn, One), E, D>;

/// What [`Tensor::try_batch_norm_train`] returns.
#[derive(Debug)]
pub struct BatchNormTrain<E: Float, D: Device<E>> {
    /// The normalised input, `[n, c, l]`, on the tape.
    pub out: Tensor<(Dyn, Dyn, Dyn), E, D>,
    /// The batch's mean per channel, `[c]` (not on the tape).
    pub mean: Tensor<(Dyn,), E, D>,
    /// The batch's biased variance per channel, `[c]` (not on the tape).
    pub var: Tensor<(Dyn,), E, D>,
}

impl<E: Float, D: Device<E>> Tensor<(Dyn, Dyn, Dyn), E, D> {
    /// Batch normalisation of `[n, c, l]` with the batch's statistics over
    /// `n` and `l` for each channel:
    /// `(x - mean) / sqrt(var + eps) * weight + bias` with the biased
    /// variance, `weight` and `bias` `[c]` (either may be left out).
    /// Returns the output (one node on the tape) and the statistics, for
    /// the running averages.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(Dyn, Dyn, Dyn), f64>::from_vec(vec![1., 10., 3., 30.], (Dyn(2), Dyn(2), Dyn(1))).unwrap();
    /// let bn = x.try_batch_norm_train(None, None, 0.0).unwrap();
    /// assert_eq!(bn.mean.to_vec(), [2.0, 20.0]);
    /// assert_eq!(bn.var.to_vec(), [1.0, 100.0]);
    /// assert_eq!(bn.out.to_vec(), [-1.0, -1.0, 1.0, 1.0]);
    /// ```
    ///
    /// # Errors
    /// A shape error when `weight` or `bias` does not hold one value per
    /// channel; an error when one is on another device.
    pub fn try_batch_norm_train(
        &self,
        weight: Option<&Tensor<(Dyn,), E, D>>,
        bias: Option<&Tensor<(Dyn,), E, D>>,
        eps: f64,
    ) -> Result<BatchNormTrain<E, D>> {
        let [n, c, l] = [self.size(0), self.size(1), self.size(2)];
        for (what, t) in [("weight", weight), ("bias", bias)] {
            if let Some(t) = t {
                self.same_device(NAME, t)?;
                if t.layout.dims[..] != [c] {
                    return Err(Error::shape(
                        NAME,
                        format!(
                            "a {what} of [{c}] (the input's channels, {})",
                            fmt_dims(&self.layout.dims)
                        ),
                        &t.layout.dims,
                    ));
                }
            }
        }
        let per_channel = |t: &Tensor<(Dyn,), E, D>| -> Result<PerChannel<E, D>> {
            t.detach().try_reshape_to((One, Dyn(c), One))
        };
        let count = 1.0 / (n * l).max(1) as f64;
        let (out, mean, rstd, var) = {
            let _g = no_grad();
            let x = self.detach();
            let mean = x.sum_keepdim::<2>().sum_keepdim::<0>().mul_scalar(count);
            let dev = try_fused((&x, &mean), |(x, m)| (x - m).square())?;
            let var = dev.sum_keepdim::<2>().sum_keepdim::<0>().mul_scalar(count);
            let rstd = var.add_scalar(eps).rsqrt();
            let out = match (weight, bias) {
                (Some(w), Some(b)) => {
                    let (w, b) = (per_channel(w)?, per_channel(b)?);
                    try_fused((&x, &mean, &rstd, &w, &b), |(x, m, r, w, b)| {
                        (x - m) * r * w + b
                    })?
                }
                (Some(w), None) => {
                    let w = per_channel(w)?;
                    try_fused((&x, &mean, &rstd, &w), |(x, m, r, w)| (x - m) * r * w)?
                }
                (None, Some(b)) => {
                    let b = per_channel(b)?;
                    try_fused((&x, &mean, &rstd, &b), |(x, m, r, b)| (x - m) * r + b)?
                }
                (None, None) => try_fused((&x, &mean, &rstd), |(x, m, r)| (x - m) * r)?,
            };
            (out, mean, rstd, var)
        };
        let stat = |t: &PerChannel<E, D>| t.try_reshape_to((Dyn(c),));
        let (mean_c, var_c) = (stat(&mean)?, stat(&var)?);
        let inputs = [
            self.var.clone(),
            weight.and_then(|w| w.var.clone()),
            bias.and_then(|b| b.var.clone()),
        ];
        let need = [
            self.var.is_some(),
            weight.is_some_and(|w| w.var.is_some()),
            bias.is_some_and(|b| b.var.is_some()),
        ];
        if !need.iter().any(|&b| b) {
            return Ok(BatchNormTrain {
                out,
                mean: mean_c,
                var: var_c,
            });
        }
        let x = self.raw();
        let w = weight.map(|w| w.detach().raw());
        let mut saved = vec![x.saved(), mean.saved(), rstd.saved()];
        saved.extend(weight.map(Tensor::saved));
        let (mean, rstd) = (mean.raw(), rstd.raw());
        let out = out.record(NAME, &inputs, saved, move |g| {
            let big = |r: &Raw<E, D>| Tensor::<(Dyn, Dyn, Dyn), E, D>::from_raw(r.clone());
            let small = |r: &Raw<E, D>| PerChannel::<E, D>::from_raw(reshape(r, &[1, c, 1])?);
            let (x, g, mean, rstd) = (big(&x)?, big(g)?, small(&mean)?, small(&rstd)?);
            let sum_g = g.sum_keepdim::<2>().sum_keepdim::<0>();
            let sum_gx = try_fused((&g, &x, &mean, &rstd), |(g, x, m, r)| g * ((x - m) * r))?
                .sum_keepdim::<2>()
                .sum_keepdim::<0>();
            let gx = need[0]
                .then(|| -> Result<Raw<E, D>> {
                    // weight * rstd, the scale of every term.
                    let k = match &w {
                        Some(w) => &rstd * &small(w)?,
                        None => rstd.clone(),
                    };
                    let a = sum_g.mul_scalar(count);
                    let b = &sum_gx.mul_scalar(count) * &rstd;
                    let gx = try_fused((&g, &x, &mean, &a, &b, &k), |(g, x, m, a, b, k)| {
                        (g - a - (x - m) * b) * k
                    })?;
                    Ok(gx.raw())
                })
                .transpose()?;
            let flat = |t: &PerChannel<E, D>| reshape(&t.raw(), &[c]);
            let gw = need[1].then(|| flat(&sum_gx)).transpose()?;
            let gb = need[2].then(|| flat(&sum_g)).transpose()?;
            Ok(vec![gx, gw, gb])
        });
        Ok(BatchNormTrain {
            out,
            mean: mean_c,
            var: var_c,
        })
    }
}
