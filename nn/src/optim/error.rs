//! [`OptimError`]: what optimizers, gradient clipping and schedulers report.

/// Why an optimizer or scheduler refused an option, a step or a state.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// An option outside its valid range, as PyTorch's constructors reject it.
    #[error("{owner}: invalid {option} {value}: {reason}")]
    InvalidOption {
        /// The optimizer, scheduler or function (`SGD`, `OneCycleLR`, ...).
        owner: &'static str,
        /// The option (`lr`, `momentum`, ...).
        option: &'static str,
        /// The rejected value, as written.
        value: String,
        /// What the value must be.
        reason: String,
    },
    /// A state saved by another kind of optimizer or scheduler.
    #[error("the state was saved by {found}, not by {expected}")]
    WrongKind {
        /// This optimizer's or scheduler's kind.
        expected: &'static str,
        /// The kind recorded in the state.
        found: String,
    },
    /// A state, a scheduler or an optimizer with another number of parameter groups.
    #[error("{what}: {found} parameter groups where {expected} were expected")]
    GroupCount {
        /// What was being matched.
        what: &'static str,
        /// The number of groups this side has.
        expected: usize,
        /// The number found.
        found: usize,
    },
    /// A state entry that is required but absent.
    #[error("state: missing key `{0}`")]
    MissingKey(String),
    /// A state entry that this optimizer or scheduler does not understand, or
    /// that names a parameter the model does not have.
    #[error("state: unexpected key `{key}` ({reason})")]
    UnexpectedKey {
        /// The key.
        key: String,
        /// Why it was not accepted.
        reason: String,
    },
    /// A state value that does not parse or is out of range.
    #[error("state: key `{key}` holds `{value}`, which is not {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The stored text.
        value: String,
        /// What was expected there.
        expected: &'static str,
    },
    /// A state buffer whose size does not fit its parameter.
    #[error(
        "state: `{param}` has {expected} elements but its saved `{buffer}` has sizes {found:?}"
    )]
    StateSize {
        /// The parameter's dotted name.
        param: String,
        /// The buffer (`exp_avg`, `momentum_buffer`, ...).
        buffer: String,
        /// The parameter's element count.
        expected: usize,
        /// The buffer's sizes.
        found: Vec<usize>,
    },
    /// A scheduler stepped past the end of its schedule.
    #[error("{owner}: tried to step {step} times, but the schedule has {total} steps")]
    PastTheEnd {
        /// The scheduler.
        owner: &'static str,
        /// The step that was asked for.
        step: i64,
        /// The schedule's length.
        total: u64,
    },
    /// A function that takes the CPU's parameters met one on another device.
    #[error(
        "parameter `{param}` has its gradient on {device}; name the element type and device: `{typed}::<f32, Cuda>(..)`"
    )]
    OtherDevice {
        /// The parameter's dotted name.
        param: String,
        /// Its device, as PyTorch prints it.
        device: String,
        /// The function to call instead.
        typed: &'static str,
    },
    /// A call out of its order, like a loss scaler's `step` twice between
    /// two `update`s (PyTorch raises the same).
    #[error("{owner}: {reason}")]
    OutOfOrder {
        /// The type or function (`GradScaler`, ...).
        owner: &'static str,
        /// What was called out of order, and the order that works.
        reason: String,
    },
    /// A tensor operation failed (a device error).
    #[error(transparent)]
    Tensor(#[from] forma_core::Error),
}

impl OptimError {
    pub(crate) fn invalid(
        owner: &'static str,
        option: &'static str,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        OptimError::InvalidOption {
            owner,
            option,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}
