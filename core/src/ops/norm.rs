//! Layer normalisation over the last axis, like
//! `F.layer_norm(x, (n,), weight, bias, eps)`: each row of `n` is shifted
//! by its mean and scaled by `1 / sqrt(var + eps)` (the biased variance),
//! then multiplied by `weight` and shifted by `bias`, both `[n]`.
//!
//! A backend may run it fused ([`NormKernel`]): one pass per row for the
//! statistics and one for the output, where the composed ops (mean,
//! variance, `rsqrt`, the scale, the shift) each make a pass over the
//! tensor and allocate a result. The fused form also returns each row's
//! mean and `rstd`, which its backward reads, as PyTorch's does:
//! `dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))` with
//! `xhat = (x - mean) * rstd` and `gw = g * weight`, `dweight = sum(g * xhat)`,
//! `dbias = sum(g)` over the rows. So training runs it too. Half types on
//! the tape, and backends without the kernel, run the composed ops, which
//! are differentiable (the statistics in a half type would cost the
//! gradient precision PyTorch keeps in f32). The two agree to rounding.

use crate::device::Backend;
use crate::dtype::{DType, Float};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::ops::fused::{fused, try_fused};
use crate::shape::{Dyn, Shape};
use crate::tape::util::{reshape, sum_to};
use crate::tape::{is_grad_enabled, Raw};
use crate::tensor::{ok, Tensor};

/// The op's name, for errors.
const NAME: &str = "layer_norm";

/// What a fused layer norm returns: the output and each row's statistics.
#[derive(Debug)]
pub struct LayerNormOut<St> {
    /// The normalised rows, row-major in the input's sizes.
    pub out: St,
    /// Each row's mean (one value per row).
    pub mean: St,
    /// Each row's `1 / sqrt(var + eps)` (one value per row).
    pub rstd: St,
}

/// Backend support for fused layer normalisation.
pub trait NormKernel<E: Float>: Backend {
    /// `(x - mean) * rstd * weight + bias` over the last axis of `x` (any
    /// strides, rank at least 1), with `mean` and the biased variance `var`
    /// of each row and `rstd = 1 / sqrt(var + eps)`; `weight` and `bias`
    /// (when given) are `[n]`. The result is row-major; `mean` and `rstd`
    /// are returned too, rounded to `E`.
    ///
    /// `Ok(None)` (the default) means the backend has no fused kernel, and
    /// the caller runs the composed ops.
    fn layer_norm(
        &self,
        x: (&Self::Storage<E>, &Layout),
        weight: Option<(&Self::Storage<E>, &Layout)>,
        bias: Option<(&Self::Storage<E>, &Layout)>,
        eps: f64,
    ) -> Result<Option<LayerNormOut<Self::Storage<E>>>> {
        let _ = (x, weight, bias, eps);
        Ok(None)
    }
}

impl<S: Shape, E: Float, D: crate::device::Device<E>> Tensor<S, E, D> {
    /// Layer normalisation over the last axis, like
    /// `F.layer_norm(x, (n,), weight, bias, eps)` with `n` the last size:
    /// `(x - mean) / sqrt(var + eps) * weight + bias`, the mean and the
    /// biased variance taken over each row of `n`. `weight` and `bias` are
    /// `[n]`; either may be left out.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<2>, C<4>)>::from_vec(vec![1., 2., 3., 4., 0., 0., 0., 8.], (C, C)).unwrap();
    /// let w = Tensor::<(Dyn,)>::from_vec(vec![2.0; 4], (Dyn(4),)).unwrap();
    /// let y = x.layer_norm(Some(&w), None, 1e-5).to_vec();
    /// // Each row has mean 0 and variance 4 (the weight is 2).
    /// for row in y.chunks(4) {
    ///     let var: f32 = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
    ///     assert!(row.iter().sum::<f32>().abs() < 1e-5 && (var - 4.0).abs() < 1e-3);
    /// }
    /// ```
    ///
    /// # Panics
    /// If `weight` or `bias` is not `[n]`, or `x` is a scalar; see
    /// [`Tensor::try_layer_norm`].
    #[track_caller]
    pub fn layer_norm(
        &self,
        weight: Option<&Tensor<(Dyn,), E, D>>,
        bias: Option<&Tensor<(Dyn,), E, D>>,
        eps: f64,
    ) -> Self {
        ok(self.try_layer_norm(weight, bias, eps))
    }

    fn try_layer_norm_unnoted(
        &self,
        weight: Option<&Tensor<(Dyn,), E, D>>,
        bias: Option<&Tensor<(Dyn,), E, D>>,
        eps: f64,
    ) -> Result<Self> {
        let dims = &self.layout.dims[..];
        let Some(&n) = dims.last() else {
            return Err(Error::shape(NAME, "an input of rank 1 or more", dims));
        };
        for (what, t) in [("weight", weight), ("bias", bias)] {
            if let Some(t) = t {
                self.same_device(NAME, t)?;
                if t.layout.dims[..] != [n] {
                    return Err(Error::shape(
                        NAME,
                        format!(
                            "a {what} of [{n}] (the input's last size, {})",
                            fmt_dims(dims)
                        ),
                        &t.layout.dims,
                    ));
                }
            }
        }
        let taped = is_grad_enabled()
            && (self.needs_grad()
                || weight.is_some_and(|w| w.needs_grad())
                || bias.is_some_and(|b| b.needs_grad()));
        let exact_stats = matches!(E::DTYPE, DType::F32 | DType::F64);
        if !taped || exact_stats {
            let (ws, bs) = (weight.map(|w| w.storage()), bias.map(|b| b.storage()));
            let fused = self.device.layer_norm(
                (&self.storage(), &self.layout),
                ws.as_deref().zip(weight.map(|w| &w.layout)),
                bs.as_deref().zip(bias.map(|b| &b.layout)),
                eps,
            )?;
            if let Some(f) = fused {
                return Ok(self.record_fused(f, n, weight, bias));
            }
        }
        composed(self, n, weight, bias, eps)
    }

    /// Fallible [`Tensor::layer_norm`].
    ///
    /// # Errors
    /// A shape error when `x` is a scalar or `weight` or `bias` is not
    /// `[n]` for the last size `n` of `x`; an error when they are on
    /// another device.
    pub fn try_layer_norm(
        &self,
        weight: Option<&Tensor<(Dyn,), E, D>>,
        bias: Option<&Tensor<(Dyn,), E, D>>,
        eps: f64,
    ) -> Result<Self> {
        let y = self.try_layer_norm_unnoted(weight, bias, eps)?;
        Ok(y.noted(|| {
            let mut ins = vec![self.val()];
            ins.extend(weight.map(|w| w.val()));
            ins.extend(bias.map(|b| b.val()));
            let (weight, bias) = (weight.is_some(), bias.is_some());
            (
                crate::graph::Op::LayerNormalization { eps, weight, bias },
                ins,
            )
        }))
    }

    /// The fused output, recorded with its backward from the saved
    /// statistics.
    fn record_fused(
        &self,
        f: LayerNormOut<D::Storage<E>>,
        n: usize,
        weight: Option<&Tensor<(Dyn,), E, D>>,
        bias: Option<&Tensor<(Dyn,), E, D>>,
    ) -> Self {
        let dims = self.layout.dims;
        let y = Self::from_storage(f.out, &dims, self.device.clone());
        let rows = self.layout.numel().checked_div(n).unwrap_or(0);
        let stat = |s| Raw::new(s, &[rows, 1], self.device.clone());
        let (mean, rstd) = (stat(f.mean), stat(f.rstd));
        let (x, w) = (self.raw(), weight.map(Tensor::raw));
        let need = [
            self.var.is_some(),
            weight.is_some_and(|w| w.var.is_some()),
            bias.is_some_and(|b| b.var.is_some()),
        ];
        let mut saved = vec![x.saved(), mean.saved(), rstd.saved()];
        saved.extend(w.as_ref().map(Raw::saved));
        let inputs = [
            self.var.clone(),
            weight.and_then(|w| w.var.clone()),
            bias.and_then(|b| b.var.clone()),
        ];
        y.record(NAME, &inputs, saved, move |g| {
            let t =
                |r: &Raw<E, D>, d: &[usize]| Tensor::<(Dyn, Dyn), E, D>::from_raw(reshape(r, d)?);
            let (x, g) = (t(&x, &[rows, n])?, t(g, &[rows, n])?);
            let (mean, rstd) = (t(&mean, &[rows, 1])?, t(&rstd, &[rows, 1])?);
            let xhat = try_fused((&x, &mean, &rstd), |(x, m, r)| (x - m) * r)?;
            let gw = match &w {
                Some(w) => &g * &t(w, &[1, n])?,
                None => g.clone(),
            };
            let gx = need[0]
                .then(|| -> Result<Raw<E, D>> {
                    let c1 = gw.mean_keepdim::<1>().into_dyn();
                    let c2 = (&gw * &xhat).mean_keepdim::<1>().into_dyn();
                    let gx =
                        try_fused((&gw, &xhat, &c1, &c2), |(gw, xh, c1, c2)| gw - c1 - xh * c2)?;
                    reshape(&(&gx * &rstd).raw(), &dims)
                })
                .transpose()?;
            let gwt = need[1]
                .then(|| sum_to(&(&g * &xhat).raw(), &[n]))
                .transpose()?;
            let gb = need[2].then(|| sum_to(&g.raw(), &[n])).transpose()?;
            Ok(vec![gx, gwt, gb])
        })
    }
}

/// The composed, differentiable form: the rows as a `[rows, n]` view.
fn composed<S: Shape, E: Float, D: crate::device::Device<E>>(
    x: &Tensor<S, E, D>,
    n: usize,
    weight: Option<&Tensor<(Dyn,), E, D>>,
    bias: Option<&Tensor<(Dyn,), E, D>>,
    eps: f64,
) -> Result<Tensor<S, E, D>> {
    let shape = S::from_dims(&x.layout.dims).expect("a tensor's dims fit its shape");
    let rows = x.layout.numel().checked_div(n).unwrap_or(0);
    let x2 = x.try_reshape_to((Dyn(rows), Dyn(n)))?;
    let mean = x2.mean_keepdim::<1>();
    let rstd = x2.var_keepdim::<1>(false).add_scalar(eps).rsqrt();
    // One pass for the normalisation and the scale.
    let y = match weight {
        Some(w) => fused((&x2, &mean, &rstd, w), |(x, m, r, w)| (x - m) * r * w),
        None => fused((&x2, &mean, &rstd), |(x, m, r)| (x - m) * r),
    };
    let y = match bias {
        Some(b) => &y + b,
        None => y,
    };
    y.try_reshape_to(shape)
}
