//! [`Cx`]: where a traversal is (the dotted path and the role of the field
//! being visited). Generated code drives it; visitors read it.

/// What a tensor is to its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A trainable parameter (`nn.Parameter`).
    Parameter,
    /// A buffer saved in the state_dict (`register_buffer(..., persistent=True)`).
    Buffer,
    /// A buffer left out of the state_dict (`persistent=False`).
    NonPersistentBuffer,
}

/// The three passes of a module's visit, in PyTorch's state_dict order: its own
/// parameters, its own buffers, then its children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Tensor fields that are parameters.
    Parameters,
    /// Tensor fields marked `#[module(buffer)]`.
    Buffers,
    /// Everything else: child modules and containers.
    Children,
}

impl Phase {
    /// The passes in order.
    pub const ALL: [Phase; 3] = [Phase::Parameters, Phase::Buffers, Phase::Children];
}

/// The traversal state: the dotted path of the current field and its role.
#[derive(Debug, Default)]
pub struct Cx {
    path: String,
    /// Path length and role to restore on each `leave`.
    stack: Vec<(usize, Role)>,
    role: Option<Role>,
}

impl Cx {
    /// A traversal at the root (empty path).
    pub fn new() -> Self {
        Cx::default()
    }

    /// The dotted name of the field being visited (`layers.0.weight`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The role given to the tensors below the current field.
    pub fn role(&self) -> Role {
        self.role.unwrap_or(Role::Parameter)
    }

    /// Enters a struct field during `phase` if it belongs there, returning
    /// whether it does (then [`Cx::leave`] must follow the visit). `key` is the
    /// field's name (possibly dotted), or `""` for a flattened field.
    pub fn enter_field(&mut self, phase: Phase, is_tensor: bool, key: &str, role: Role) -> bool {
        let belongs = match phase {
            Phase::Parameters => is_tensor && role == Role::Parameter,
            Phase::Buffers => is_tensor && role != Role::Parameter,
            Phase::Children => !is_tensor,
        };
        if belongs {
            self.push(key);
            self.role = Some(role);
        }
        belongs
    }

    /// Enters an element of a container (`layers.3`), keeping the role.
    pub fn enter_index(&mut self, index: usize) {
        self.push(&index.to_string());
    }

    /// Leaves the field or element entered last.
    pub fn leave(&mut self) {
        if let Some((len, role)) = self.stack.pop() {
            self.path.truncate(len);
            self.role = Some(role);
        }
    }

    fn push(&mut self, key: &str) {
        self.stack.push((self.path.len(), self.role()));
        if !key.is_empty() {
            if !self.path.is_empty() {
                self.path.push('.');
            }
            self.path.push_str(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_and_restore() {
        let mut cx = Cx::new();
        assert!(cx.enter_field(Phase::Children, false, "layers", Role::Parameter));
        cx.enter_index(0);
        assert!(cx.enter_field(Phase::Buffers, true, "running_mean", Role::Buffer));
        assert_eq!(cx.path(), "layers.0.running_mean");
        assert_eq!(cx.role(), Role::Buffer);
        cx.leave();
        assert_eq!(cx.role(), Role::Parameter);
        cx.leave();
        assert!(cx.enter_field(Phase::Children, false, "", Role::Parameter));
        assert_eq!(cx.path(), "layers");
        cx.leave();
        cx.leave();
        assert_eq!(cx.path(), "");
        assert!(!cx.enter_field(Phase::Parameters, false, "fc", Role::Parameter));
    }
}
