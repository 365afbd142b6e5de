//! Build-time checks of the output sizes a caller states for sliding-window
//! layers (convolution, pooling): stable Rust cannot compute
//! `(h + 2p - d(k - 1) - 1) / s + 1` in a type, so the layer takes the output
//! size from the caller's annotation and asserts it in a const block, which
//! `cargo build` reports with the sizes in decimal. A `Dyn` size is checked at
//! run time instead.

use forma_core::shape::check::ConstMsg;
use forma_core::shape::window::{pool_window_out, transposed_window_out};

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
    assert_pool_window(
        layer, axis, input, kernel, stride, padding, dilation, false, output,
    )
}

/// [`assert_window`] for a pooling window, which may round its output size
/// up (`ceil_mode`, PyTorch's rule: the last window starts inside the input
/// or its left padding).
#[allow(clippy::too_many_arguments)]
pub const fn assert_pool_window(
    layer: &str,
    axis: &str,
    input: Option<usize>,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
    ceil_mode: bool,
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
    let msg = if dilation != 1 {
        msg.s(", dilation ").n(dilation)
    } else {
        msg
    };
    let msg = if ceil_mode { msg.s(", ceil_mode") } else { msg };
    match pool_window_out(input, kernel, stride, padding, dilation, ceil_mode) {
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
    // PyTorch refuses these options before it computes a size.
    let limit = if stride > dilation { stride } else { dilation };
    let valid = stride > 0 && dilation > 0 && output_padding < limit;
    let out = if valid {
        transposed_window_out(input, kernel, stride, padding, output_padding, dilation)
    } else {
        None
    };
    match out {
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
