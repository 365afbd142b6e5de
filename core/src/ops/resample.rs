//! Resampling the spatial axes of an NCHW tensor: `pixel_shuffle` and
//! `pixel_unshuffle` (channels to space and back, like
//! `F.pixel_shuffle`/`F.pixel_unshuffle`) and `interpolate` (nearest,
//! nearest-exact and bilinear, like `F.interpolate`, with PyTorch's source
//! index rules for `size` and `scale_factor`).
//!
//! The shape rule: a rank-4 `(N, C, H, W)` tensor; `N` keeps its type, the
//! axes whose sizes change become [`Dyn`]. Composite: gathers
//! (`index_select`) with indices computed on the host, and for bilinear a
//! weighted sum of two gathers per axis, so the gradients are those of the
//! gathers and products (PyTorch's, up to the order of additions).

use crate::device::Device;
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::shape::{Dim, Dyn, HasAxis};
use crate::tensor::{ok, Tensor};

/// The output size of [`Tensor::interpolate`]: `size=(h, w)` or
/// `scale_factor=(sh, sw)` (sizes rounded down, and the scale itself used to
/// map output to input positions, as PyTorch does when
/// `recompute_scale_factor` is not set).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resize {
    /// The output height and width.
    Size(usize, usize),
    /// Factors for the height and width.
    Scale(f64, f64),
}

/// How [`Tensor::interpolate`] computes a value, like `F.interpolate`'s `mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    /// `"nearest"`: source index `floor(dst * scale)`.
    Nearest,
    /// `"nearest-exact"`: source index `floor((dst + 0.5) * scale)`.
    NearestExact,
    /// `"bilinear"`, with `align_corners`.
    Bilinear {
        /// Corner pixels of input and output are aligned (`align_corners=True`).
        align_corners: bool,
    },
}

/// One axis of a resampling: for each output position, two source indices
/// and the weight of the second (nearest modes use only the first).
struct AxisMap {
    lo: Vec<i64>,
    hi: Vec<i64>,
    frac: Vec<f64>,
}

impl AxisMap {
    /// PyTorch's `area_pixel_compute_source_index` and nearest index rules
    /// for an axis of `n` elements resampled to `out`, with the user's scale
    /// factor when one was given.
    fn new(n: usize, out: usize, scale: Option<f64>, mode: Interpolation) -> Self {
        let ratio = |align: bool| -> f64 {
            if align {
                if out > 1 {
                    (n as f64 - 1.0) / (out as f64 - 1.0)
                } else {
                    0.0
                }
            } else {
                match scale {
                    Some(s) if s > 0.0 => 1.0 / s,
                    _ => n as f64 / out as f64,
                }
            }
        };
        let last = n as i64 - 1;
        let mut map = AxisMap {
            lo: Vec::with_capacity(out),
            hi: Vec::with_capacity(out),
            frac: Vec::with_capacity(out),
        };
        for d in 0..out {
            let (lo, hi, frac) = match mode {
                Interpolation::Nearest => {
                    // PyTorch computes the nearest index in f32.
                    let r = ratio(false) as f32;
                    let i = ((d as f32 * r).floor() as i64).min(last);
                    (i, i, 0.0)
                }
                Interpolation::NearestExact => {
                    let r = ratio(false) as f32;
                    let i = (((d as f32 + 0.5) * r).floor() as i64).min(last);
                    (i, i, 0.0)
                }
                Interpolation::Bilinear { align_corners } => {
                    let r = ratio(align_corners);
                    let src = if align_corners {
                        r * d as f64
                    } else {
                        (r * (d as f64 + 0.5) - 0.5).max(0.0)
                    };
                    let lo = (src.floor() as i64).min(last);
                    let hi = (lo + 1).min(last);
                    (lo, hi, src - lo as f64)
                }
            };
            map.lo.push(lo);
            map.hi.push(hi);
            map.frac.push(frac);
        }
        map
    }
}

impl<N: Dim, Ch: Dim, H: Dim, W: Dim, E: Float, D: Device<E>> Tensor<(N, Ch, H, W), E, D> {
    /// Rearranges `(N, C·r², H, W)` into `(N, C, H·r, W·r)`, like
    /// `F.pixel_shuffle(x, r)`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<1>, C<4>, C<1>, C<1>)>::from_vec(vec![1., 2., 3., 4.], (C, C, C, C)).unwrap();
    /// let y = x.pixel_shuffle(2);
    /// assert_eq!(y.dims()[..], [1, 1, 2, 2]);
    /// assert_eq!(y.to_vec(), [1., 2., 3., 4.]);
    /// ```
    ///
    /// # Panics
    /// When the channels are not a multiple of `r²`; see [`Tensor::try_pixel_shuffle`].
    #[track_caller]
    pub fn pixel_shuffle(&self, r: usize) -> Tensor<(N, Dyn, Dyn, Dyn), E, D> {
        ok(self.try_pixel_shuffle(r))
    }

    /// [`Tensor::pixel_shuffle`], returning PyTorch's refusals as errors.
    ///
    /// # Errors
    /// `r` is zero or the channels are not a multiple of `r²`.
    pub fn try_pixel_shuffle(&self, r: usize) -> Result<Tensor<(N, Dyn, Dyn, Dyn), E, D>> {
        let [n, c, h, w] = self.dims4();
        if r == 0 || c % (r * r) != 0 {
            return Err(Error::invalid(
                "pixel_shuffle",
                format!("{c} channels are not a multiple of the upscale factor {r} squared"),
            ));
        }
        let (co, ho, wo) = (c / (r * r), h * r, w * r);
        let mut idx = Vec::with_capacity(n * c * h * w);
        for b in 0..n {
            for k in 0..co {
                for y in 0..ho {
                    for x in 0..wo {
                        let ci = k * r * r + (y % r) * r + x % r;
                        idx.push((((b * c + ci) * h + y / r) * w + x / r) as i64);
                    }
                }
            }
        }
        self.gather_flat(idx, [n, co, ho, wo])
    }

    /// Rearranges `(N, C, H·r, W·r)` into `(N, C·r², H, W)`, like
    /// `F.pixel_unshuffle(x, r)`, the inverse of [`Tensor::pixel_shuffle`].
    ///
    /// # Panics
    /// When the height or width is not a multiple of `r`; see [`Tensor::try_pixel_unshuffle`].
    #[track_caller]
    pub fn pixel_unshuffle(&self, r: usize) -> Tensor<(N, Dyn, Dyn, Dyn), E, D> {
        ok(self.try_pixel_unshuffle(r))
    }

    /// [`Tensor::pixel_unshuffle`], returning PyTorch's refusals as errors.
    ///
    /// # Errors
    /// `r` is zero or the height or width is not a multiple of `r`.
    pub fn try_pixel_unshuffle(&self, r: usize) -> Result<Tensor<(N, Dyn, Dyn, Dyn), E, D>> {
        let [n, c, h, w] = self.dims4();
        if r == 0 || h % r != 0 || w % r != 0 {
            return Err(Error::invalid(
                "pixel_unshuffle",
                format!("height {h} and width {w} are not multiples of the downscale factor {r}"),
            ));
        }
        let (co, ho, wo) = (c * r * r, h / r, w / r);
        let mut idx = Vec::with_capacity(n * c * h * w);
        for b in 0..n {
            for k in 0..co {
                let (ci, dy, dx) = (k / (r * r), (k / r) % r, k % r);
                for y in 0..ho {
                    for x in 0..wo {
                        idx.push((((b * c + ci) * h + y * r + dy) * w + x * r + dx) as i64);
                    }
                }
            }
        }
        self.gather_flat(idx, [n, co, ho, wo])
    }

    /// Resamples the height and width, like `F.interpolate(x, size=..)` or
    /// `F.interpolate(x, scale_factor=..)` with `mode` `"nearest"`,
    /// `"nearest-exact"` or `"bilinear"`.
    ///
    /// ```
    /// use forma::prelude::*;
    /// use forma::core::ops::resample::{Interpolation, Resize};
    /// let x = Tensor::<(C<1>, C<1>, C<1>, C<2>)>::from_vec(vec![1., 3.], (C, C, C, C)).unwrap();
    /// let y = x.interpolate(Resize::Scale(1.0, 2.0), Interpolation::Nearest);
    /// assert_eq!(y.to_vec(), [1., 1., 3., 3.]);
    /// let y = x.interpolate(Resize::Size(1, 4), Interpolation::Bilinear { align_corners: false });
    /// assert_eq!(y.to_vec(), [1., 1.5, 2.5, 3.]);
    /// ```
    ///
    /// # Panics
    /// On an empty output or input; see [`Tensor::try_interpolate`].
    #[track_caller]
    pub fn interpolate(
        &self,
        size: Resize,
        mode: Interpolation,
    ) -> Tensor<(N, Ch, Dyn, Dyn), E, D> {
        ok(self.try_interpolate(size, mode))
    }

    /// [`Tensor::interpolate`], returning PyTorch's refusals as errors.
    ///
    /// # Errors
    /// An output or input size of zero, or a scale factor that is not
    /// positive and finite.
    pub fn try_interpolate(
        &self,
        size: Resize,
        mode: Interpolation,
    ) -> Result<Tensor<(N, Ch, Dyn, Dyn), E, D>> {
        let [_, _, h, w] = self.dims4();
        let (oh, ow, sh, sw) = match size {
            Resize::Size(oh, ow) => (oh, ow, None, None),
            Resize::Scale(sh, sw) => {
                if !(sh.is_finite() && sh > 0.0 && sw.is_finite() && sw > 0.0) {
                    return Err(Error::invalid(
                        "interpolate",
                        format!("scale factors ({sh}, {sw}) must be positive and finite"),
                    ));
                }
                let floor = |n: usize, s: f64| (n as f64 * s).floor() as usize;
                (floor(h, sh), floor(w, sw), Some(sh), Some(sw))
            }
        };
        if oh == 0 || ow == 0 || h == 0 || w == 0 {
            return Err(Error::invalid(
                "interpolate",
                format!("cannot resample {h}x{w} to {oh}x{ow}: sizes must be positive"),
            ));
        }
        let x: Tensor<Dyn4, E, D> = self.clone().retype();
        let x = resample_axis::<2, E, D>(&x, AxisMap::new(h, oh, sh, mode))?;
        let y = resample_axis::<3, E, D>(&x, AxisMap::new(w, ow, sw, mode))?;
        Ok(y.retype())
    }

    fn dims4(&self) -> [usize; 4] {
        let d = &self.layout.dims;
        [d[0], d[1], d[2], d[3]]
    }

    /// Element `idx[i]` of the flattened tensor as element `i` of a tensor of `dims`.
    fn gather_flat(
        &self,
        idx: Vec<i64>,
        dims: [usize; 4],
    ) -> Result<Tensor<(N, Dyn, Dyn, Dyn), E, D>> {
        let flat = self.try_reshape_to((Dyn(self.numel()),))?;
        let picked = flat.select_along::<0>(idx)?;
        let y = picked.try_reshape_to((Dyn(dims[0]), Dyn(dims[1]), Dyn(dims[2]), Dyn(dims[3])))?;
        Ok(y.retype())
    }
}

type Dyn4 = (Dyn, Dyn, Dyn, Dyn);

/// Resamples axis `AX` of `x` by `map`: one gather for the nearest modes,
/// `lo * (1 - frac) + hi * frac` for bilinear (skipped where no output
/// position reads a second element).
fn resample_axis<const AX: isize, E: Float, D: Device<E>>(
    x: &Tensor<Dyn4, E, D>,
    map: AxisMap,
) -> Result<Tensor<Dyn4, E, D>>
where
    Dyn4: HasAxis<AX, Replaced<Dyn> = Dyn4>,
{
    let ax = <Dyn4 as HasAxis<AX>>::INDEX;
    let lo: Tensor<Dyn4, E, D> = x.select_along::<AX>(map.lo.clone())?;
    if map.frac.iter().all(|&f| f == 0.0) {
        return Ok(lo);
    }
    let hi: Tensor<Dyn4, E, D> = x.select_along::<AX>(map.hi)?;
    let dims = lo.layout.dims;
    let mut wdims = [Dyn(1); 4];
    wdims[ax] = Dyn(map.frac.len());
    let weight = |v: Vec<E>| -> Result<Tensor<Dyn4, E, D>> {
        Tensor::<Dyn4, E, D>::from_vec_on(v, (wdims[0], wdims[1], wdims[2], wdims[3]), &x.device)?
            .try_expand((Dyn(dims[0]), Dyn(dims[1]), Dyn(dims[2]), Dyn(dims[3])))
    };
    let w_hi = weight(map.frac.iter().map(|&f| E::from_f64(f)).collect())?;
    let w_lo = weight(map.frac.iter().map(|&f| E::from_f64(1.0 - f)).collect())?;
    lo.try_mul(&w_lo)?.try_add(&hi.try_mul(&w_hi)?)
}
