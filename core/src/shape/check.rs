//! Compile-time checks that need arithmetic on sizes (element counts for
//! `reshape`/`flatten`). Trait impls cannot compute `A * B` on stable Rust, so
//! these are const assertions evaluated when the generic op is instantiated:
//! `cargo build` reports them at the user's call site with the sizes in decimal
//! (`cargo check` does not evaluate them; see the ui-tests README).

/// A message assembled at compile time, so a const panic can print sizes.
#[derive(Clone, Copy, Debug)]
pub struct ConstMsg {
    buf: [u8; 256],
    len: usize,
}

impl ConstMsg {
    /// An empty message.
    pub const fn new() -> Self {
        ConstMsg {
            buf: [0; 256],
            len: 0,
        }
    }

    /// Appends text.
    pub const fn s(mut self, text: &str) -> Self {
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() && self.len < self.buf.len() {
            self.buf[self.len] = b[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// Appends a number in decimal.
    pub const fn n(mut self, mut v: usize) -> Self {
        let mut digits = [0u8; 20];
        let mut k = 20;
        if v == 0 {
            k -= 1;
            digits[k] = b'0';
        }
        while v > 0 {
            k -= 1;
            digits[k] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        while k < 20 && self.len < self.buf.len() {
            self.buf[self.len] = digits[k];
            self.len += 1;
            k += 1;
        }
        self
    }

    /// The message so far.
    pub const fn as_str(&self) -> &str {
        let (bytes, _) = self.buf.split_at(self.len);
        match core::str::from_utf8(bytes) {
            Ok(s) => s,
            Err(_) => "shape check failed",
        }
    }

    /// Panics with the message (at compile time when called in a const).
    pub const fn panic(&self) -> ! {
        panic!("{}", self.as_str())
    }
}

impl Default for ConstMsg {
    fn default() -> Self {
        Self::new()
    }
}

/// Asserts at compile time that two static element counts agree; `None`
/// (a shape with `Dyn` dims) defers the check to run time.
pub const fn assert_same_numel(op: &str, from: Option<usize>, to: Option<usize>) {
    if let (Some(a), Some(b)) = (from, to) {
        if a != b {
            ConstMsg::new()
                .s(op)
                .s(": cannot turn a tensor of ")
                .n(a)
                .s(" elements into a shape of ")
                .n(b)
                .s(" elements")
                .panic();
        }
    }
}

/// Asserts at compile time that the two pieces of a `cat` add up to the
/// stated size along the axis; a `None` (`Dyn`) defers to run time.
pub const fn assert_cat_sum(a: Option<usize>, b: Option<usize>, out: Option<usize>) {
    if let (Some(a), Some(b), Some(out)) = (a, b, out) {
        if a + b != out {
            ConstMsg::new()
                .s("cat_with: pieces of ")
                .n(a)
                .s(" and ")
                .n(b)
                .s(" along the axis give ")
                .n(a + b)
                .s(", not ")
                .n(out)
                .panic();
        }
    }
}
