//! Build-time checks of the output sizes a caller states for sliding-window
//! layers (convolution, pooling): stable Rust cannot compute
//! `(h + 2p - d(k - 1) - 1) / s + 1` in a type, so the layer takes the output
//! size from the caller's annotation and asserts it in a const block, which
//! `cargo build` reports with the sizes in decimal. A `Dyn` size is checked at
//! run time instead.

use forma_core::shape::check::ConstMsg;

/// The output length of a window: `None` when the kernel does not fit.
pub const fn window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation * (kernel - 1) + 1;
    let padded = input + 2 * padding;
    if kernel == 0 || stride == 0 || padded < span {
        None
    } else {
        Some((padded - span) / stride + 1)
    }
}

/// Asserts that a stated output size fits the window arithmetic. Sizes that
/// are `None` (`Dyn`) are left to the run-time check.
pub const fn assert_window(
    layer: &str,
    axis: &str,
    input: Option<usize>,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    output: Option<usize>,
) {
    let Some(input) = input else { return };
    let msg = ConstMsg::new()
        .s(layer)
        .s(": an input ")
        .s(axis)
        .s(" of ")
        .n(input)
        .s(" with kernel ")
        .n(kernel)
        .s(", stride ")
        .n(stride)
        .s(", padding ")
        .n(padding);
    match window_out(input, kernel, stride, padding, dilation) {
        None => msg
            .s(" leaves no output (the kernel is larger than the padded input)")
            .panic(),
        Some(out) => {
            if let Some(stated) = output {
                if stated != out {
                    msg.s(" gives an output ")
                        .s(axis)
                        .s(" of ")
                        .n(out)
                        .s(", not ")
                        .n(stated)
                        .panic()
                }
            }
        }
    }
}

/// The output length of a transposed window,
/// `(input - 1) s - 2p + d(k - 1) + output_padding + 1`: `None` when it is not
/// positive or the options are invalid (zero stride, dilation or kernel, or an
/// output padding not smaller than the stride or the dilation).
pub const fn transposed_window_out(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
) -> Option<usize> {
    let limit = if stride > dilation { stride } else { dilation };
    if kernel == 0 || stride == 0 || dilation == 0 || input == 0 || output_padding >= limit {
        return None;
    }
    let full = (input - 1) * stride + dilation * (kernel - 1) + output_padding + 1;
    if full <= 2 * padding {
        None
    } else {
        Some(full - 2 * padding)
    }
}

/// Asserts that a stated output size fits a transposed convolution's
/// arithmetic; sizes that are `None` (`Dyn`) are left to the run-time check.
pub const fn assert_transposed_window(
    layer: &str,
    axis: &str,
    input: Option<usize>,
    kernel: usize,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
    output: Option<usize>,
) {
    let Some(input) = input else { return };
    let msg = ConstMsg::new()
        .s(layer)
        .s(": an input ")
        .s(axis)
        .s(" of ")
        .n(input)
        .s(" with kernel ")
        .n(kernel)
        .s(", stride ")
        .n(stride)
        .s(", padding ")
        .n(padding)
        .s(", output padding ")
        .n(output_padding);
    match transposed_window_out(input, kernel, stride, padding, output_padding, dilation) {
        None => msg
            .s(" leaves no output (or the output padding is not smaller than the stride or dilation)")
            .panic(),
        Some(out) => {
            if let Some(stated) = output {
                if stated != out {
                    msg.s(" gives an output ")
                        .s(axis)
                        .s(" of ")
                        .n(out)
                        .s(", not ")
                        .n(stated)
                        .panic()
                }
            }
        }
    }
}

/// Asserts that attention's embedding size splits evenly into heads.
pub const fn assert_heads(embed: usize, heads: usize) {
    if heads == 0 || !embed.is_multiple_of(heads) {
        ConstMsg::new()
            .s("MultiheadAttention: an embedding size of ")
            .n(embed)
            .s(" cannot be split into ")
            .n(heads)
            .s(" heads of equal size")
            .panic()
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
    }

    #[test]
    fn transposed_sizes_follow_pytorch() {
        // nn.ConvTranspose2d(.., 3, stride=2, padding=1, output_padding=1): 4 -> 8
        assert_eq!(transposed_window_out(4, 3, 2, 1, 1, 1), Some(8));
        assert_eq!(transposed_window_out(5, 4, 1, 0, 0, 1), Some(8));
        // output_padding may reach the dilation when the stride is smaller
        assert_eq!(transposed_window_out(4, 3, 1, 0, 1, 2), Some(9));
        assert_eq!(transposed_window_out(4, 3, 2, 0, 2, 1), None);
        assert_eq!(transposed_window_out(1, 1, 1, 1, 0, 1), None);
    }
}
