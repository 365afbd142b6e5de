//! [`ParamRef`]: a module's parameters as optimizers and gradient clipping
//! see them: flat views that share the parameters' storage.

use super::{Cx, Module, Role, Visitor};
use forma_core::device::Device;
use forma_core::{Backend, Dtype, Dyn, Float, Shape, Tensor};

/// One parameter: its dotted name, a flat view of its values (writing through
/// it with [`Tensor::assign`] updates the parameter in place) and its flat
/// gradient, if backward has reached it.
#[derive(Clone, Debug)]
pub struct ParamRef<E: Float, D: Device<E>> {
    /// The dotted name, as in the state_dict.
    pub name: String,
    /// The values, flattened; shares the parameter's storage.
    pub value: Tensor<(Dyn,), E, D>,
    /// The accumulated gradient, flattened (a copy).
    pub grad: Option<Tensor<(Dyn,), E, D>>,
}

/// Every parameter of `m` whose element type is `E` on device `D`, in
/// state_dict order.
///
/// # Panics
/// If a parameter is a non-contiguous view (its flat view would be a copy,
/// and updates through it would be lost).
pub fn parameters<M: Module, E: Float, D: Device<E>>(m: &M) -> Vec<ParamRef<E, D>> {
    struct Collect<E: Float, D: Device<E>>(Vec<ParamRef<E, D>>);
    impl<E: Float, D: Device<E>> Visitor for Collect<E, D> {
        fn tensor<S: Shape, E2: Dtype, D2: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E2, D2>) {
            if cx.role() != Role::Parameter {
                return;
            }
            let Some(t) = super::downcast_ref::<S, E2, D2, E, D>(t) else {
                return;
            };
            assert!(
                t.is_contiguous(),
                "parameter `{}` is a non-contiguous view; make it contiguous before optimizing it",
                cx.path()
            );
            self.0.push(ParamRef {
                name: cx.path().to_string(),
                value: t.detach().flatten_all(),
                grad: t.grad().map(|g| g.flatten_all()),
            });
        }
    }
    let mut c = Collect(Vec::new());
    m.visit(&mut Cx::new(), &mut c);
    c.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use forma_core::C;
    use forma_cpu::Cpu;

    #[test]
    fn writes_through_the_flat_view_reach_the_parameter() {
        let w = Tensor::<(C<2>, C<2>), f32, Cpu>::full_on((C, C), 1.0, &Cpu).requires_grad();
        (&w * &w).sum_all().backward();
        let ps = parameters::<_, f32, Cpu>(&w);
        assert_eq!(ps.len(), 1);
        let p = &ps[0];
        assert_eq!(p.grad.as_ref().map(|g| g.to_vec()), Some(vec![2.0; 4]));
        p.value.assign(&p.value.mul_scalar(3.0));
        assert_eq!(w.to_vec(), [3.0; 4]);
    }
}
