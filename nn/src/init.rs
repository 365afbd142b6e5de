//! Parameter initialisation: PyTorch's `torch.nn.init`, drawing from one
//! seedable [`Rng`], so a seeded model is reproducible.
//!
//! Each scheme fills a float tensor in place (`kaiming_uniform_(&w, ...)`,
//! outside the autograd graph, like PyTorch's `torch.no_grad()` fills; every
//! clone and view of the tensor sees the new values), or builds a new one
//! ([`Init::tensor`]). Fans and gains follow PyTorch's
//! `_calculate_fan_in_and_fan_out` and [`calculate_gain`] exactly: for a
//! weight `[out, in, k...]`, `fan_in = in * prod(k)` and `fan_out = out * prod(k)`.
//! The values differ from PyTorch's (another generator) but have the same
//! distributions.
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::init::{self, FanMode, Nonlinearity};
//! let mut rng = Rng::seed_from(0);
//! let w = Tensor::<(C<64>, C<128>)>::zeros();
//! init::kaiming_uniform_(&w, 0.0, FanMode::FanIn, Nonlinearity::Relu, &mut rng).unwrap();
//! let bound = (6.0f32 / 128.0).sqrt();   // gain sqrt(2) * sqrt(3 / fan_in)
//! assert!(w.to_vec().iter().all(|v| v.abs() <= bound));
//! ```

use forma_core::device::Device;
use forma_core::dtype::libm_erf;
use forma_core::error::fmt_dims;
use forma_core::{Float, Rng, Shape, Tensor};

/// Why a tensor could not be initialised.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InitError {
    /// The scheme needs fans (or a matrix) and the tensor has fewer than 2 dims.
    #[error("{op}: needs a tensor with at least 2 dimensions (fan in and fan out are undefined for shape {shape})")]
    NeedsRank2 {
        /// The scheme.
        op: &'static str,
        /// The tensor's shape.
        shape: String,
    },
    /// An argument outside the scheme's domain (a negative std, `a > b`).
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The scheme.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// A backend failure while writing the values.
    #[error(transparent)]
    Core(#[from] forma_core::Error),
}

/// The nonlinearity a layer feeds, for [`calculate_gain`] (PyTorch's strings
/// `"linear"`, `"conv2d"`, `"relu"`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nonlinearity {
    /// `linear` (gain 1).
    Linear,
    /// `conv1d` (gain 1).
    Conv1d,
    /// `conv2d` (gain 1).
    Conv2d,
    /// `conv3d` (gain 1).
    Conv3d,
    /// `conv_transpose1d` (gain 1).
    ConvTranspose1d,
    /// `conv_transpose2d` (gain 1).
    ConvTranspose2d,
    /// `conv_transpose3d` (gain 1).
    ConvTranspose3d,
    /// `sigmoid` (gain 1).
    Sigmoid,
    /// `tanh` (gain 5/3).
    Tanh,
    /// `relu` (gain sqrt 2).
    Relu,
    /// `leaky_relu` (gain `sqrt(2 / (1 + slope^2))`, slope from `param`, default 0.01).
    LeakyRelu,
    /// `selu` (gain 3/4).
    Selu,
}

/// The recommended gain for a nonlinearity, like `nn.init.calculate_gain(nonlinearity, param)`.
/// `param` is the negative slope of [`Nonlinearity::LeakyRelu`] (default
/// 0.01) and is ignored by the others.
///
/// ```
/// use forma::nn::init::{calculate_gain, Nonlinearity};
/// assert_eq!(calculate_gain(Nonlinearity::Tanh, None), 5.0 / 3.0);
/// assert_eq!(calculate_gain(Nonlinearity::LeakyRelu, Some(0.0)), 2f64.sqrt());
/// ```
pub fn calculate_gain(nonlinearity: Nonlinearity, param: Option<f64>) -> f64 {
    use Nonlinearity::*;
    match nonlinearity {
        Linear | Conv1d | Conv2d | Conv3d | ConvTranspose1d | ConvTranspose2d | ConvTranspose3d
        | Sigmoid => 1.0,
        Tanh => 5.0 / 3.0,
        Relu => 2f64.sqrt(),
        LeakyRelu => {
            let slope = param.unwrap_or(0.01);
            (2.0 / (1.0 + slope * slope)).sqrt()
        }
        Selu => 3.0 / 4.0,
    }
}

/// Which fan [`kaiming_uniform_`] and [`kaiming_normal_`] preserve the
/// variance of: the forward pass's (`fan_in`, the default) or the backward's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FanMode {
    /// `mode='fan_in'`.
    #[default]
    FanIn,
    /// `mode='fan_out'`.
    FanOut,
}

/// `(fan_in, fan_out)` of a weight of sizes `dims`, like PyTorch's
/// `nn.init._calculate_fan_in_and_fan_out`: `dims[1] * r` and `dims[0] * r`
/// where `r` is the product of the sizes after the second (the receptive field).
///
/// ```
/// use forma::nn::init::calculate_fan_in_and_fan_out;
/// assert_eq!(calculate_fan_in_and_fan_out(&[16, 3, 5, 5]).unwrap(), (75, 400));
/// ```
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn calculate_fan_in_and_fan_out(dims: &[usize]) -> Result<(usize, usize), InitError> {
    fans("calculate_fan_in_and_fan_out", dims)
}

fn fans(op: &'static str, dims: &[usize]) -> Result<(usize, usize), InitError> {
    if dims.len() < 2 {
        return Err(InitError::NeedsRank2 {
            op,
            shape: fmt_dims(dims),
        });
    }
    let receptive: usize = dims[2..].iter().product();
    Ok((dims[1] * receptive, dims[0] * receptive))
}

fn invalid(op: &'static str, msg: impl Into<String>) -> InitError {
    InitError::InvalidArgument {
        op,
        msg: msg.into(),
    }
}

/// Overwrites `t` with values drawn from `f`, in row-major order.
fn fill<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    mut f: impl FnMut() -> f64,
) -> Result<(), InitError> {
    let values: Vec<E> = (0..t.numel()).map(|_| E::from_f64(f())).collect();
    t.try_assign(&Tensor::from_vec_on(values, t.shape(), t.device())?)?;
    Ok(())
}

/// Fills `t` from `U(a, b)`, like `nn.init.uniform_(t, a, b)`.
///
/// # Errors
/// [`InitError::InvalidArgument`] when `a > b` or a bound is not finite.
pub fn uniform_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    a: f64,
    b: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    if !(a.is_finite() && b.is_finite() && a <= b) {
        return Err(invalid(
            "uniform_",
            format!("needs finite a <= b, got a = {a}, b = {b}"),
        ));
    }
    fill(t, || a + (b - a) * rng.uniform())
}

/// Fills `t` from `N(mean, std^2)`, like `nn.init.normal_(t, mean, std)`.
///
/// # Errors
/// [`InitError::InvalidArgument`] for a negative or non-finite `std`.
pub fn normal_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    mean: f64,
    std: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    if !(std.is_finite() && std >= 0.0 && mean.is_finite()) {
        return Err(invalid(
            "normal_",
            format!("needs a finite mean and std >= 0, got mean = {mean}, std = {std}"),
        ));
    }
    fill(t, || mean + std * rng.normal())
}

/// The inverse of `erf` on `(-1, 1)` (`±inf` at `±1`): Giles' approximation
/// refined by two Newton steps on [`libm_erf`] to double precision.
fn erfinv(y: f64) -> f64 {
    if y <= -1.0 {
        return if y == -1.0 {
            f64::NEG_INFINITY
        } else {
            f64::NAN
        };
    }
    if y >= 1.0 {
        return if y == 1.0 { f64::INFINITY } else { f64::NAN };
    }
    let w = -((1.0 - y) * (1.0 + y)).ln();
    let p = if w < 5.0 {
        let w = w - 2.5;
        [
            3.432_739_39e-7,
            -3.523_387_7e-6,
            -4.391_506_54e-6,
            2.185_808_7e-4,
            -1.253_725_03e-3,
            -4.177_681_64e-3,
            2.466_407_27e-1,
            1.501_409_41,
        ]
        .iter()
        .fold(2.810_226_36e-8, |p, c| c + p * w)
    } else {
        let w = w.sqrt() - 3.0;
        [
            1.009_505_58e-4,
            1.349_343_22e-3,
            -3.673_428_44e-3,
            5.739_507_73e-3,
            -7.622_461_3e-3,
            9.438_870_47e-3,
            1.001_674_06,
            2.832_976_82,
        ]
        .iter()
        .fold(-2.002_142_57e-4, |p, c| c + p * w)
    };
    let mut x = p * y;
    for _ in 0..2 {
        let slope = std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp();
        if slope > 0.0 {
            x -= (libm_erf(x) - y) / slope;
        }
    }
    x
}

/// Fills `t` from `N(mean, std^2)` truncated to `[a, b]`, like
/// `nn.init.trunc_normal_(t, mean, std, a, b)` (PyTorch's defaults: 0, 1, -2,
/// 2), by the same inverse-CDF method.
///
/// # Errors
/// [`InitError::InvalidArgument`] for a `std` that is not positive or `a >= b`.
pub fn trunc_normal_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    mean: f64,
    std: f64,
    a: f64,
    b: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    if !(std.is_finite() && std > 0.0 && mean.is_finite() && a < b) {
        return Err(invalid(
            "trunc_normal_",
            format!("needs std > 0 and a < b, got mean = {mean}, std = {std}, a = {a}, b = {b}"),
        ));
    }
    let cdf = |x: f64| (1.0 + libm_erf(x / std::f64::consts::SQRT_2)) / 2.0;
    let (lo, hi) = (
        2.0 * cdf((a - mean) / std) - 1.0,
        2.0 * cdf((b - mean) / std) - 1.0,
    );
    fill(t, || {
        let u = lo + (hi - lo) * rng.uniform();
        (erfinv(u) * std * std::f64::consts::SQRT_2 + mean).clamp(a, b)
    })
}

/// Fills `t` with `value`, like `nn.init.constant_(t, value)`.
///
/// # Errors
/// A backend failure.
pub fn constant_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    value: f64,
) -> Result<(), InitError> {
    t.try_assign(&Tensor::full_on(t.shape(), E::from_f64(value), t.device()))?;
    Ok(())
}

/// Fills `t` with zeros, like `nn.init.zeros_(t)`.
///
/// # Errors
/// A backend failure.
pub fn zeros_<S: Shape, E: Float, D: Device<E>>(t: &Tensor<S, E, D>) -> Result<(), InitError> {
    constant_(t, 0.0)
}

/// Fills `t` with ones, like `nn.init.ones_(t)`.
///
/// # Errors
/// A backend failure.
pub fn ones_<S: Shape, E: Float, D: Device<E>>(t: &Tensor<S, E, D>) -> Result<(), InitError> {
    constant_(t, 1.0)
}

/// Glorot uniform: `U(-a, a)` with `a = gain * sqrt(6 / (fan_in + fan_out))`,
/// like `nn.init.xavier_uniform_(t, gain)`.
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn xavier_uniform_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    gain: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    let (fi, fo) = fans("xavier_uniform_", &t.dims())?;
    let a = 3f64.sqrt() * gain * (2.0 / (fi + fo) as f64).sqrt();
    fill(t, || -a + 2.0 * a * rng.uniform())
}

/// Glorot normal: `N(0, std^2)` with `std = gain * sqrt(2 / (fan_in + fan_out))`,
/// like `nn.init.xavier_normal_(t, gain)`.
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn xavier_normal_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    gain: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    let (fi, fo) = fans("xavier_normal_", &t.dims())?;
    let std = gain * (2.0 / (fi + fo) as f64).sqrt();
    fill(t, || std * rng.normal())
}

/// The std of He initialisation for `t`, as PyTorch computes it.
fn kaiming_std(
    op: &'static str,
    dims: &[usize],
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<f64, InitError> {
    let (fi, fo) = fans(op, dims)?;
    let fan = match mode {
        FanMode::FanIn => fi,
        FanMode::FanOut => fo,
    };
    Ok(calculate_gain(nonlinearity, Some(a)) / (fan as f64).sqrt())
}

/// He uniform: `U(-bound, bound)` with `bound = gain * sqrt(3 / fan)`, like
/// `nn.init.kaiming_uniform_(t, a, mode, nonlinearity)` (PyTorch's defaults:
/// `a = 0`, [`FanMode::FanIn`], [`Nonlinearity::LeakyRelu`]; `a` is the
/// leaky ReLU's negative slope). `a = sqrt(5)` with `LeakyRelu` is PyTorch's
/// default for `Linear` and `Conv` weights, `bound = 1 / sqrt(fan_in)`.
/// A tensor with no elements is left as is, as in PyTorch.
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn kaiming_uniform_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
    rng: &mut Rng,
) -> Result<(), InitError> {
    if t.numel() == 0 {
        return Ok(());
    }
    let bound = 3f64.sqrt() * kaiming_std("kaiming_uniform_", &t.dims(), a, mode, nonlinearity)?;
    fill(t, || -bound + 2.0 * bound * rng.uniform())
}

/// He normal: `N(0, std^2)` with `std = gain / sqrt(fan)`, like
/// `nn.init.kaiming_normal_(t, a, mode, nonlinearity)`. A tensor with no
/// elements is left as is.
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn kaiming_normal_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
    rng: &mut Rng,
) -> Result<(), InitError> {
    if t.numel() == 0 {
        return Ok(());
    }
    let std = kaiming_std("kaiming_normal_", &t.dims(), a, mode, nonlinearity)?;
    fill(t, || std * rng.normal())
}

/// The thin `Q` (`m x n`, row-major, `m >= n`) of the QR decomposition of
/// the row-major `m x n` matrix `a`, by Householder reflections in f64, with
/// the signs chosen so that `R` has a non-negative diagonal (PyTorch's
/// `q * sign(diag(r))`, which makes `Q` of a Gaussian matrix Haar-distributed).
fn householder_q(mut a: Vec<f64>, m: usize, n: usize) -> Vec<f64> {
    let at = |i: usize, j: usize| i * n + j;
    let mut vs: Vec<Vec<f64>> = Vec::with_capacity(n);
    let mut diag = Vec::with_capacity(n);
    for k in 0..n {
        let norm = (k..m)
            .map(|i| a[at(i, k)] * a[at(i, k)])
            .sum::<f64>()
            .sqrt();
        let x0 = a[at(k, k)];
        // alpha = -sign(x0) * |x|, so v = x - alpha e0 does not cancel.
        let alpha = if x0 >= 0.0 { -norm } else { norm };
        let mut v: Vec<f64> = (k..m).map(|i| a[at(i, k)]).collect();
        v[0] -= alpha;
        let vnorm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if vnorm > 0.0 {
            v.iter_mut().for_each(|x| *x /= vnorm);
            for j in k..n {
                let s: f64 = (k..m).map(|i| v[i - k] * a[at(i, j)]).sum();
                for i in k..m {
                    a[at(i, j)] -= 2.0 * v[i - k] * s;
                }
            }
        } else {
            // The column is already zero below the diagonal: no reflection.
            v.iter_mut().for_each(|x| *x = 0.0);
        }
        diag.push(a[at(k, k)]);
        vs.push(v);
    }
    // Q = H_0 H_1 ... H_{n-1} applied to the first n columns of the identity.
    let mut q = vec![0.0; m * n];
    for j in 0..n {
        q[at(j, j)] = 1.0;
    }
    for k in (0..n).rev() {
        let v = &vs[k];
        for j in 0..n {
            let s: f64 = (k..m).map(|i| v[i - k] * q[at(i, j)]).sum();
            for i in k..m {
                q[at(i, j)] -= 2.0 * v[i - k] * s;
            }
        }
    }
    for (j, d) in diag.iter().enumerate() {
        // PyTorch's sign(0) would zero the column; a zero pivot of a Gaussian
        // matrix has probability 0, and keeping the column is the safer choice.
        if *d < 0.0 {
            for i in 0..m {
                q[at(i, j)] = -q[at(i, j)];
            }
        }
    }
    q
}

/// A (semi-)orthogonal matrix scaled by `gain`, like
/// `nn.init.orthogonal_(t, gain)`: the tensor is viewed as `[dims[0],
/// numel / dims[0]]`, and its rows (if fewer) or columns are orthonormal. The
/// QR decomposition of a Gaussian matrix runs on the host in f64.
///
/// # Errors
/// [`InitError::NeedsRank2`] for fewer than 2 dims.
pub fn orthogonal_<S: Shape, E: Float, D: Device<E>>(
    t: &Tensor<S, E, D>,
    gain: f64,
    rng: &mut Rng,
) -> Result<(), InitError> {
    let dims = t.dims();
    if dims.len() < 2 {
        return Err(InitError::NeedsRank2 {
            op: "orthogonal_",
            shape: fmt_dims(&dims),
        });
    }
    if t.numel() == 0 {
        return Ok(());
    }
    let rows = dims[0];
    let cols = t.numel() / rows;
    let flat: Vec<f64> = (0..rows * cols).map(|_| rng.normal()).collect();
    let values = if rows < cols {
        // QR of the transpose (cols x rows), then transpose Q back.
        let tr: Vec<f64> = (0..cols * rows)
            .map(|k| flat[(k % rows) * cols + k / rows])
            .collect();
        let q = householder_q(tr, cols, rows);
        (0..rows * cols)
            .map(|k| q[(k % cols) * rows + k / cols])
            .collect()
    } else {
        householder_q(flat, rows, cols)
    };
    let mut it = values.into_iter();
    fill(t, || gain * it.next().unwrap_or(0.0))
}

/// An initialisation scheme as a value, to fill tensors in place
/// ([`Init::init_`]) or build new ones ([`Init::tensor`]).
///
/// ```
/// use forma::prelude::*;
/// use forma::nn::init::Init;
/// let mut rng = Rng::seed_from(1);
/// let w: Tensor<(C<8>, C<8>)> = Init::Orthogonal { gain: 1.0 }.tensor((C, C), &Cpu, &mut rng).unwrap();
/// let wwt = w.matmul(&w.t()).to_vec();
/// assert!((wwt[0] - 1.0).abs() < 1e-5 && wwt[1].abs() < 1e-5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// [`uniform_`].
    Uniform {
        /// Lower bound.
        a: f64,
        /// Upper bound.
        b: f64,
    },
    /// [`normal_`].
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
    /// [`trunc_normal_`].
    TruncNormal {
        /// Mean of the untruncated normal.
        mean: f64,
        /// Its standard deviation.
        std: f64,
        /// Lower cut.
        a: f64,
        /// Upper cut.
        b: f64,
    },
    /// [`constant_`].
    Constant(f64),
    /// [`xavier_uniform_`].
    XavierUniform {
        /// Scale.
        gain: f64,
    },
    /// [`xavier_normal_`].
    XavierNormal {
        /// Scale.
        gain: f64,
    },
    /// [`kaiming_uniform_`].
    KaimingUniform {
        /// Negative slope of the leaky ReLU.
        a: f64,
        /// The fan to preserve.
        mode: FanMode,
        /// The nonlinearity that follows.
        nonlinearity: Nonlinearity,
    },
    /// [`kaiming_normal_`].
    KaimingNormal {
        /// Negative slope of the leaky ReLU.
        a: f64,
        /// The fan to preserve.
        mode: FanMode,
        /// The nonlinearity that follows.
        nonlinearity: Nonlinearity,
    },
    /// [`orthogonal_`].
    Orthogonal {
        /// Scale.
        gain: f64,
    },
}

impl Init {
    /// Fills `t` in place with this scheme.
    ///
    /// # Errors
    /// As the scheme's function.
    pub fn init_<S: Shape, E: Float, D: Device<E>>(
        &self,
        t: &Tensor<S, E, D>,
        rng: &mut Rng,
    ) -> Result<(), InitError> {
        match *self {
            Init::Uniform { a, b } => uniform_(t, a, b, rng),
            Init::Normal { mean, std } => normal_(t, mean, std, rng),
            Init::TruncNormal { mean, std, a, b } => trunc_normal_(t, mean, std, a, b, rng),
            Init::Constant(v) => constant_(t, v),
            Init::XavierUniform { gain } => xavier_uniform_(t, gain, rng),
            Init::XavierNormal { gain } => xavier_normal_(t, gain, rng),
            Init::KaimingUniform {
                a,
                mode,
                nonlinearity,
            } => kaiming_uniform_(t, a, mode, nonlinearity, rng),
            Init::KaimingNormal {
                a,
                mode,
                nonlinearity,
            } => kaiming_normal_(t, a, mode, nonlinearity, rng),
            Init::Orthogonal { gain } => orthogonal_(t, gain, rng),
        }
    }

    /// A new tensor of `shape` on `device` filled with this scheme.
    ///
    /// # Errors
    /// As the scheme's function.
    pub fn tensor<S: Shape, E: Float, D: Device<E>>(
        &self,
        shape: S,
        device: &D,
        rng: &mut Rng,
    ) -> Result<Tensor<S, E, D>, InitError> {
        let t = Tensor::zeros_on(shape, device);
        self.init_(&t, rng)?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfinv_inverts_erf_to_double_precision() {
        // scipy.special.erfinv(0.5) and erfinv(-0.999).
        assert!((erfinv(0.5) - 0.476_936_276_204_469_9).abs() < 1e-15);
        assert!((erfinv(-0.999) + 2.326_753_765_513_524_6).abs() < 1e-13);
        for k in -999..=999 {
            let y = k as f64 / 1000.0;
            assert!((libm_erf(erfinv(y)) - y).abs() < 5e-16, "erf(erfinv({y}))");
        }
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert_eq!(erfinv(-1.0), f64::NEG_INFINITY);
        assert!(erfinv(1.5).is_nan());
    }

    #[test]
    fn householder_q_of_a_known_matrix() {
        // [[3, 1], [4, 2], [0, 0]]: Q's first column is [0.6, 0.8, 0]
        // (R's diagonal made positive), the second is orthogonal to it.
        let q = householder_q(vec![3.0, 1.0, 4.0, 2.0, 0.0, 0.0], 3, 2);
        let want = [0.6, -0.8, 0.8, 0.6, 0.0, 0.0];
        for (a, b) in q.iter().zip(want) {
            assert!((a - b).abs() < 1e-15, "{q:?}");
        }
    }
}
