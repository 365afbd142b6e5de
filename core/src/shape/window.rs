//! The sliding-window rule of convolution and pooling, once: the output
//! length of a window of `kernel` taps `dilation` apart, moved `stride` at a
//! time over an input padded by `padding` on each side. `const fn`s, so the
//! ops' run-time checks, the layers' build-time assertions and anything
//! else that needs an output size use the same arithmetic.

/// The span of a dilated kernel, `d(k - 1) + 1`; `None` for an empty
/// kernel or one whose span overflows.
const fn span(kernel: usize, dilation: usize) -> Option<usize> {
    if kernel == 0 {
        return None;
    }
    match dilation.checked_mul(kernel - 1) {
        Some(s) => s.checked_add(1),
        None => None,
    }
}

/// `input + 2 * padding`, `None` on overflow.
const fn padded(input: usize, padding: usize) -> Option<usize> {
    match padding.checked_mul(2) {
        Some(p) => input.checked_add(p),
        None => None,
    }
}

/// Output length of a window (convolution, pooling without `ceil_mode`):
/// `(input + 2p - d(k - 1) - 1) / s + 1`, PyTorch's formula. `None` when the
/// kernel is empty, the stride zero, or the window does not fit the padded
/// input.
///
/// ```
/// use forma::core::shape::window::window_out;
/// assert_eq!(window_out(28, 5, 1, 2, 1), Some(28)); // 5x5, padding 2: "same"
/// assert_eq!(window_out(7, 3, 2, 1, 1), Some(4));
/// assert_eq!(window_out(3, 5, 1, 0, 1), None);      // a kernel larger than the input
/// ```
pub const fn window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    match (span(kernel, dilation), padded(input, padding)) {
        (Some(span), Some(padded)) if stride > 0 && padded >= span => {
            Some((padded - span) / stride + 1)
        }
        _ => None,
    }
}

/// Output length of a pooled window with PyTorch's rule: as
/// [`window_out`], rounding up with `ceil_mode`, where the last window must
/// still start inside the input or its left padding.
///
/// ```
/// use forma::core::shape::window::pool_window_out;
/// assert_eq!(pool_window_out(5, 2, 2, 0, 1, false), Some(2));
/// assert_eq!(pool_window_out(5, 2, 2, 0, 1, true), Some(3));
/// ```
pub const fn pool_window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
) -> Option<usize> {
    let (Some(span), Some(padded)) = (span(kernel, dilation), padded(input, padding)) else {
        return None;
    };
    if stride == 0 || padded < span {
        return None;
    }
    if !ceil_mode {
        return Some((padded - span) / stride + 1);
    }
    let out = (padded - span).div_ceil(stride) + 1;
    if (out - 1) * stride >= input + padding {
        Some(out - 1)
    } else {
        Some(out)
    }
}

/// Output length of a transposed convolution,
/// `(input - 1) s - 2p + d(k - 1) + output_padding + 1`: `None` when the
/// input or the kernel is empty or the length is not positive. The options
/// themselves (a zero stride or dilation, an output padding not smaller
/// than the stride or the dilation) are the caller's to refuse, with its
/// own message.
///
/// ```
/// use forma::core::shape::window::transposed_window_out;
/// // nn.ConvTranspose2d(.., 3, stride=2, padding=1, output_padding=1): 4 -> 8
/// assert_eq!(transposed_window_out(4, 3, 2, 1, 1, 1), Some(8));
/// ```
pub const fn transposed_window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
) -> Option<usize> {
    let Some(span) = span(kernel, dilation) else {
        return None;
    };
    if input == 0 {
        return None;
    }
    let Some(steps) = (input - 1).checked_mul(stride) else {
        return None;
    };
    let Some(full) = steps.checked_add(span) else {
        return None;
    };
    let Some(full) = full.checked_add(output_padding) else {
        return None;
    };
    match full.checked_sub(2 * padding) {
        Some(n) if n > 0 => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_sizes_follow_pytorch() {
        assert_eq!(window_out(28, 5, 1, 2, 1), Some(28));
        assert_eq!(window_out(28, 2, 2, 0, 1), Some(14));
        assert_eq!(window_out(7, 3, 2, 1, 1), Some(4));
        assert_eq!(window_out(3, 5, 1, 0, 1), None);
        assert_eq!(window_out(10, 3, 1, 0, 2), Some(6));
        assert_eq!(window_out(10, 0, 1, 0, 1), None);
        assert_eq!(window_out(10, 3, 0, 0, 1), None);
        assert_eq!(window_out(10, 3, 1, usize::MAX, 1), None);
    }

    #[test]
    fn pool_sizes_follow_pytorch() {
        // nn.MaxPool2d(3, 2, ceil_mode=True) on 6: windows at 0, 2, 4 (the
        // last one hangs over the edge), PyTorch gives 3.
        assert_eq!(pool_window_out(6, 3, 2, 0, 1, true), Some(3));
        assert_eq!(pool_window_out(6, 3, 2, 0, 1, false), Some(2));
        // A last window starting in the right padding is dropped: 5 with
        // padding 1 would round up to 4 windows, PyTorch gives 3.
        assert_eq!(pool_window_out(5, 2, 2, 1, 1, true), Some(3));
        assert_eq!(pool_window_out(4, 2, 2, 1, 1, true), Some(3));
    }

    #[test]
    fn transposed_sizes_follow_pytorch() {
        assert_eq!(transposed_window_out(4, 3, 2, 1, 1, 1), Some(8));
        assert_eq!(transposed_window_out(5, 4, 1, 0, 0, 1), Some(8));
        assert_eq!(transposed_window_out(4, 3, 1, 0, 1, 2), Some(9));
        assert_eq!(transposed_window_out(1, 1, 1, 1, 0, 1), None);
        assert_eq!(transposed_window_out(0, 3, 1, 0, 0, 1), None);
    }
}
