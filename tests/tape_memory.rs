//! The tape never leaks: after each training step of a small model, no graph
//! node and no saved activation is left alive. (Its own test binary: the
//! counters are process-wide.)

use forma::core::tape::{live_nodes, live_saved, no_grad};
use forma::prelude::*;

#[test]
fn ten_thousand_steps_leave_no_nodes_behind() {
    let mut rng = Rng::seed_from(3);
    let w1 = Tensor::<(C<4>, C<8>)>::randn((C, C), &mut rng).requires_grad();
    let w2 = Tensor::<(C<8>, C<1>)>::randn((C, C), &mut rng).requires_grad();
    let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(16), C), &mut rng);
    let target = Tensor::<(Dyn, C<1>)>::randn((Dyn(16), C), &mut rng);
    let mut first_loss = None;
    for step in 0..10_000 {
        w1.zero_grad();
        w2.zero_grad();
        let h = x.matmul(&w1).relu();
        let y = h.matmul(&w2);
        let loss = (&y - &target).square().mean_all();
        loss.backward();
        let l = loss.item();
        first_loss.get_or_insert(l);
        // A plain SGD step in place, outside the graph.
        for (p, lr) in [
            (&w1.clone().into_dyn(), 0.01),
            (&w2.clone().into_dyn(), 0.01),
        ] {
            let _no_grad = no_grad();
            let g = p.grad().unwrap();
            p.assign(&(p - &g.mul_scalar(lr)));
        }
        drop((h, y, loss));
        assert_eq!(live_nodes(), 0, "step {step}: tape nodes left alive");
        assert_eq!(live_saved(), 0, "step {step}: saved activations left alive");
        if step == 9_999 {
            assert!(
                l < first_loss.unwrap(),
                "training made progress: {l} < {first_loss:?}"
            );
        }
    }
}
