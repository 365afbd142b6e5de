//! [`Module`] for what a model's fields hold besides derived modules: tensors
//! (parameters and buffers), containers of modules, and plain values.

use super::{Cx, Module, ReprNode, Visitor, VisitorMut};
use forma_core::{Backend, Dtype, Shape, Tensor};

impl<S: Shape, E: Dtype, D: Backend> Module for Tensor<S, E, D> {
    const IS_TENSOR: bool = true;

    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        v.tensor(cx, self);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        v.tensor(cx, self);
    }
}

/// A field type that `#[module(buffer)]` may mark: a tensor, or an optional
/// tensor or a list of them.
#[diagnostic::on_unimplemented(
    message = "`#[module(buffer)]` marks a tensor, but this field holds a `{Self}`",
    label = "not a tensor",
    note = "a buffer is a `Tensor` (or an `Option`, `Vec` or array of them)"
)]
pub trait TensorField {}

impl<S: Shape, E: Dtype, D: Backend> TensorField for Tensor<S, E, D> {}
impl<T: TensorField> TensorField for Option<T> {}
impl<T: TensorField> TensorField for Vec<T> {}
impl<T: TensorField, const N: usize> TensorField for [T; N] {}

impl<M: Module> Module for Option<M> {
    const IS_TENSOR: bool = M::IS_TENSOR;

    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        if let Some(m) = self {
            m.visit(cx, v);
        }
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        if let Some(m) = self {
            m.visit_mut(cx, v);
        }
    }

    fn describe(&self) -> Option<ReprNode> {
        self.as_ref().and_then(M::describe)
    }
}

impl<M: Module + ?Sized> Module for Box<M> {
    const IS_TENSOR: bool = M::IS_TENSOR;

    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        (**self).visit(cx, v);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        (**self).visit_mut(cx, v);
    }

    fn describe(&self) -> Option<ReprNode> {
        (**self).describe()
    }
}

/// A `ModuleList` (or `ParameterList`) node for the elements of a container.
fn describe_list<'a, M: Module + 'a>(items: impl Iterator<Item = &'a M>) -> Option<ReprNode> {
    if !M::IS_TENSOR {
        let mut node = ReprNode::list("ModuleList");
        for (i, m) in items.enumerate() {
            if let Some(c) = m.describe() {
                node.child(&i.to_string(), c);
            }
        }
        return (!node.children().is_empty()).then_some(node);
    }
    struct Line(Option<String>);
    impl Visitor for Line {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, _: &Cx, t: &Tensor<S, E, D>) {
            let dims: Vec<String> = t.dims().iter().map(|d| d.to_string()).collect();
            self.0 = Some(format!(
                "Parameter containing: [torch.{} of size {}]",
                t.dtype(),
                dims.join("x")
            ));
        }
    }
    let mut node = ReprNode::list("ParameterList");
    for (i, m) in items.enumerate() {
        let mut line = Line(None);
        m.visit(&mut Cx::new(), &mut line);
        if let Some(l) = line.0 {
            node.child(&i.to_string(), ReprNode::text(l));
        }
    }
    Some(node)
}

macro_rules! list_impl {
    ($([$($gen:tt)*] $ty:ty),*) => {$(
        impl<$($gen)*> Module for $ty {
            fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
                for (i, m) in self.iter().enumerate() {
                    cx.enter_index(i);
                    m.visit(cx, v);
                    cx.leave();
                }
            }

            fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
                for (i, m) in self.iter_mut().enumerate() {
                    cx.enter_index(i);
                    m.visit_mut(cx, v);
                    cx.leave();
                }
            }

            fn describe(&self) -> Option<ReprNode> {
                describe_list(self.iter())
            }
        }
    )*};
}

list_impl!([M: Module] Vec<M>, [M: Module, const N: usize] [M; N]);

macro_rules! tuple_impl {
    ($(($($i:tt $t:ident),+))*) => {$(
        impl<$($t: Module),+> Module for ($($t,)+) {
            fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
                $(cx.enter_index($i); self.$i.visit(cx, v); cx.leave();)+
            }

            fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
                $(cx.enter_index($i); self.$i.visit_mut(cx, v); cx.leave();)+
            }

            fn describe(&self) -> Option<ReprNode> {
                let mut node = ReprNode::new("Sequential", "");
                $(if let Some(c) = self.$i.describe() {
                    node.child(stringify!($i), c);
                })+
                Some(node)
            }
        }
    )*};
}

tuple_impl! {
    (0 A)
    (0 A, 1 B)
    (0 A, 1 B, 2 C)
    (0 A, 1 B, 2 C, 3 D)
    (0 A, 1 B, 2 C, 3 D, 4 F)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H, 7 I)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H, 7 I, 8 J)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H, 7 I, 8 J, 9 K)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H, 7 I, 8 J, 9 K, 10 L)
    (0 A, 1 B, 2 C, 3 D, 4 F, 5 G, 6 H, 7 I, 8 J, 9 K, 10 L, 11 M)
}

/// Plain values a model keeps beside its tensors (sizes, rates, flags,
/// names): they hold no tensors, so visiting them does nothing.
macro_rules! plain_impl {
    ($($t:ty),*) => {$(
        impl Module for $t {
            fn visit<V: Visitor>(&self, _: &mut Cx, _: &mut V) {}
            fn visit_mut<V: VisitorMut>(&mut self, _: &mut Cx, _: &mut V) {}
        }
    )*};
}

plain_impl!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    usize,
    i8,
    i16,
    i32,
    i64,
    isize,
    f32,
    f64,
    String,
    &'static str
);

impl<T: ?Sized> Module for std::marker::PhantomData<T> {
    fn visit<V: Visitor>(&self, _: &mut Cx, _: &mut V) {}
    fn visit_mut<V: VisitorMut>(&mut self, _: &mut Cx, _: &mut V) {}
}

/// A module's train/eval flag, like PyTorch's `self.training`: `true` on
/// construction, set by [`Module::train`] and [`Module::eval`] on every
/// module below. Layers that behave differently (Dropout, BatchNorm) keep one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Training(pub bool);

impl Default for Training {
    fn default() -> Self {
        Training(true)
    }
}

impl Training {
    /// Whether the module is in training mode.
    pub fn is_on(self) -> bool {
        self.0
    }
}

impl Module for Training {
    fn visit<V: Visitor>(&self, cx: &mut Cx, v: &mut V) {
        v.training(cx, self.0);
    }

    fn visit_mut<V: VisitorMut>(&mut self, cx: &mut Cx, v: &mut V) {
        v.training(cx, &mut self.0);
    }
}
