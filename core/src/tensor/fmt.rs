//! `Debug` and `Display` in the style of PyTorch's print: nested brackets,
//! aligned values, one number style per tensor (integers as `3.`, four
//! decimals, or scientific), large tensors summarised with `...`, then shape,
//! dtype and device.

use super::Tensor;
use crate::device::Backend;
use crate::dtype::{DType, Dtype};
use crate::shape::Shape;
use std::fmt;

/// Tensors with more elements than this print only their edges (PyTorch's threshold).
const THRESHOLD: usize = 1000;
/// Elements kept at each edge of a summarised dim.
const EDGE: usize = 3;

/// How float values are written, chosen once per tensor as PyTorch does.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Every finite value is an integer: `3.`
    Int,
    /// Four decimals: `0.2500`
    Fixed,
    /// Scientific, when magnitudes span more than 1000x or leave [1e-4, 1e8): `1.0000e+03`
    Sci,
}

fn choose_mode(vals: &[f64]) -> Mode {
    let finite: Vec<f64> = vals.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.iter().all(|v| v.fract() == 0.0) {
        return Mode::Int;
    }
    let nonzero: Vec<f64> = finite
        .iter()
        .filter(|v| **v != 0.0)
        .map(|v| v.abs())
        .collect();
    let (lo, hi) = nonzero
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if !nonzero.is_empty() && (hi / lo > 1000.0 || hi > 1e8 || lo < 1e-4) {
        Mode::Sci
    } else {
        Mode::Fixed
    }
}

fn fmt_value(v: f64, dtype: DType, mode: Mode) -> String {
    match dtype {
        DType::Bool => (if v != 0.0 { "True" } else { "False" }).to_string(),
        DType::I64 | DType::U32 => format!("{v}"),
        _ if v.is_nan() => "nan".to_string(),
        _ if v.is_infinite() => (if v > 0.0 { "inf" } else { "-inf" }).to_string(),
        _ => match mode {
            Mode::Int => format!("{v:.0}."),
            Mode::Fixed => format!("{v:.4}"),
            Mode::Sci => {
                // Rust writes `1.0000e3`; PyTorch writes `1.0000e+03`.
                let s = format!("{v:.4e}");
                let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
                let e: i32 = exp.parse().unwrap_or(0);
                format!("{mant}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
            }
        },
    }
}

fn write_nested(
    out: &mut String,
    vals: &[String],
    dims: &[usize],
    strides: &[usize],
    base: usize,
    summarise: bool,
    indent: usize,
) {
    out.push('[');
    let n = dims[0];
    let idx: Vec<Option<usize>> = if summarise && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain([None])
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, i) in idx.iter().enumerate() {
        if k > 0 {
            if dims.len() > 1 {
                out.push(',');
                out.push_str(&"\n".repeat(dims.len() - 1));
                out.push_str(&" ".repeat(indent + 1));
            } else {
                out.push_str(", ");
            }
        }
        match i {
            None => out.push_str("..."),
            Some(i) if dims.len() == 1 => out.push_str(&vals[base + i * strides[0]]),
            Some(i) => write_nested(
                out,
                vals,
                &dims[1..],
                &strides[1..],
                base + i * strides[0],
                summarise,
                indent + 1,
            ),
        }
    }
    out.push(']');
}

impl<S: Shape, E: Dtype, D: Backend> fmt::Display for Tensor<S, E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = match self.try_to_vec() {
            Ok(d) => d,
            Err(e) => return write!(f, "tensor(<unreadable: {e}>)"),
        };
        let dims = self.dims();
        let vals: Vec<f64> = data.iter().map(|v| v.to_f64()).collect();
        let mode = choose_mode(&vals);
        let mut strs: Vec<String> = vals.iter().map(|&v| fmt_value(v, E::DTYPE, mode)).collect();
        let width = strs.iter().map(String::len).max().unwrap_or(0);
        for s in &mut strs {
            *s = format!("{s:>width$}");
        }
        let mut body = String::new();
        if dims.is_empty() {
            body.push_str(strs.first().map_or("", String::as_str));
        } else {
            let strides = crate::layout::Layout::contiguous(&dims).strides;
            write_nested(
                &mut body,
                &strs,
                &dims,
                &strides,
                0,
                data.len() > THRESHOLD,
                7,
            );
        }
        write!(
            f,
            "tensor({body}, shape={:?}, dtype={}, device={})",
            dims,
            E::DTYPE,
            self.device.name()
        )
    }
}

impl<S: Shape, E: Dtype, D: Backend> fmt::Debug for Tensor<S, E, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
