//! The fused in-place updates against the composed ops they replace: the
//! same bits for f32 and f64, for every rule and option combination, over
//! several steps; buffers updated in place; exported and loaded states
//! independent of later steps.

use super::fused::with_composed_only;
use super::*;
use forma_core::{Dtype, Dyn, Tensor};
use forma_cpu::{Cpu, PAR_CHUNK};

type Param<E> = Tensor<(Dyn,), E, Cpu>;

/// Deterministic values in about [-2, 2], with exact zeros and both signs.
fn values<E: Float>(n: usize, seed: u64) -> Vec<E> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 97 == 5 {
                return E::from_f64(0.0);
            }
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            E::from_f64(4.0 * u - 2.0)
        })
        .collect()
}

/// Two parameters: a small one (a tail block) and one large enough for the
/// CPU kernel's parallel chunks.
fn model<E: Float>() -> (Param<E>, Param<E>) {
    let p = |n: usize, seed| {
        Param::<E>::from_vec(values(n, seed), (Dyn(n),))
            .expect("n values")
            .requires_grad()
    };
    (p(37, 1), p(2 * PAR_CHUNK + 100, 2))
}

fn set_grads<E: Float>(m: &(Param<E>, Param<E>), step: u64) {
    for (i, p) in [&m.0, &m.1].into_iter().enumerate() {
        let n = p.numel();
        let g =
            Param::<E>::from_vec(values(n, 100 * step + i as u64), (Dyn(n),)).expect("n values");
        p.try_set_grad(&g).expect("same sizes");
    }
}

fn bits<E: Float>(t: &Param<E>) -> Vec<u64> {
    t.to_vec()
        .iter()
        .map(|v| Dtype::to_f64(*v).to_bits())
        .collect()
}

/// Runs `make()`'s optimizer on the fused and on the composed path for a
/// few steps, and checks both give the same bits (parameters, buffers,
/// steps), and that the fused path updated its buffers in place.
fn same_bits<A: Algorithm, E: Float>(case: &str, make: impl Fn() -> GroupedOptimizer<A, E, Cpu>) {
    let (fm, cm) = (model::<E>(), model::<E>());
    let (mut fo, mut co) = (make(), make());
    let mut kept: Vec<(&str, Param<E>)> = Vec::new();
    for step in 0..4 {
        set_grads(&fm, step);
        set_grads(&cm, step);
        fo.step(&fm);
        with_composed_only(|| co.step(&cm));
        assert_eq!(bits(&fm.0), bits(&cm.0), "{case}: step {step}, small");
        assert_eq!(bits(&fm.1), bits(&cm.1), "{case}: step {step}, large");
        assert!(
            fo.state_dict() == co.state_dict(),
            "{case}: step {step}: the states differ"
        );
        // A buffer kept from the previous step is the one now in the state.
        let st = fo.param_state("1").expect("a state");
        for (name, t) in &kept {
            let now = st.buffer(name).expect("the buffer is kept");
            assert!(now.shares_storage(t), "{case}: {name} was replaced");
        }
        kept = st.buffers().map(|(n, t)| (n, t.clone())).collect();
    }
    // The updates moved the parameters: the comparison is not vacuous.
    assert_ne!(bits(&fm.1), bits(&model::<E>().1), "{case}");
}

fn each_dtype<A: Algorithm>(case: &str, options: A) {
    same_bits(&format!("{case} f32"), || {
        GroupedOptimizer::<A, f32, Cpu>::new(options.clone())
    });
    same_bits(&format!("{case} f64"), || {
        GroupedOptimizer::<A, f64, Cpu>::new(options.clone())
    });
}

#[test]
fn adam_and_adamw_fused_match_composed_bit_for_bit() {
    for amsgrad in [false, true] {
        for maximize in [false, true] {
            // beta1 = 0.3 takes lerp's other formula (weight 0.7 >= 0.5).
            for (betas, wd) in [((0.9, 0.999), 0.0), ((0.3, 0.95), 0.1)] {
                let o = AdamOptions::default()
                    .lr(0.01)
                    .betas(betas)
                    .weight_decay(wd)
                    .amsgrad(amsgrad)
                    .maximize(maximize);
                each_dtype(&format!("{o:?}"), o);
                let o = AdamWOptions::default()
                    .lr(0.01)
                    .betas(betas)
                    .weight_decay(wd * 0.5)
                    .amsgrad(amsgrad)
                    .maximize(maximize);
                each_dtype(&format!("{o:?}"), o);
            }
        }
    }
}

#[test]
fn sgd_fused_matches_composed_bit_for_bit() {
    for maximize in [false, true] {
        for wd in [0.0, 0.05] {
            for (momentum, dampening, nesterov) in [
                (0.0, 0.0, false),
                (0.9, 0.0, false),
                (0.9, 0.2, false),
                (0.8, 0.0, true),
            ] {
                let o = SgdOptions::default()
                    .lr(0.1)
                    .momentum(momentum)
                    .dampening(dampening)
                    .nesterov(nesterov)
                    .weight_decay(wd)
                    .maximize(maximize);
                each_dtype(&format!("{o:?}"), o);
            }
        }
    }
}

#[test]
fn rmsprop_fused_matches_composed_bit_for_bit() {
    for centered in [false, true] {
        for momentum in [0.0, 0.5] {
            // alpha = 0.2 takes lerp's other formula (weight 0.8).
            for (alpha, wd, maximize) in [(0.99, 0.0, false), (0.2, 0.1, true)] {
                let o = RmsPropOptions::default()
                    .lr(0.01)
                    .alpha(alpha)
                    .weight_decay(wd)
                    .momentum(momentum)
                    .centered(centered)
                    .maximize(maximize);
                each_dtype(&format!("{o:?}"), o);
            }
        }
    }
}

#[test]
fn adagrad_fused_matches_composed_bit_for_bit() {
    for (lr_decay, wd, init, maximize) in [(0.0, 0.0, 0.0, false), (0.1, 0.05, 0.3, true)] {
        let o = AdagradOptions::default()
            .lr(0.1)
            .lr_decay(lr_decay)
            .weight_decay(wd)
            .initial_accumulator_value(init)
            .maximize(maximize);
        each_dtype(&format!("{o:?}"), o);
    }
}

#[test]
fn an_exported_state_does_not_follow_later_steps() {
    let m = model::<f32>();
    let mut opt: Adam = Adam::new(AdamOptions::default().lr(0.1).amsgrad(true));
    set_grads(&m, 0);
    opt.step(&m);
    let exported = opt.state_dict();
    let copy = exported.clone();
    set_grads(&m, 1);
    opt.step(&m);
    assert_eq!(exported, copy);
    assert_ne!(opt.state_dict().tensors, exported.tensors);
}

#[test]
fn a_cloned_optimizer_keeps_its_own_buffers() {
    let m = model::<f32>();
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9));
    set_grads(&m, 0);
    opt.step(&m);
    let twin = opt.clone();
    let before = twin.state_dict();
    set_grads(&m, 1);
    opt.step(&m);
    assert_eq!(twin.state_dict(), before);
    assert_ne!(opt.state_dict().tensors, before.tensors);
}

#[test]
fn a_loaded_state_is_copied_in_and_resumes_bit_for_bit() {
    let options = AdamWOptions::default().lr(0.05);
    // One run of three steps, and one that stops after the first, saves,
    // loads into a new optimizer and takes the other two.
    let (m1, m2) = (model::<f32>(), model::<f32>());
    let mut straight: AdamW = AdamW::new(options.clone());
    let mut first: AdamW = AdamW::new(options.clone());
    set_grads(&m1, 0);
    set_grads(&m2, 0);
    straight.step(&m1);
    first.step(&m2);
    let saved = first.state_dict();
    let copy = saved.clone();
    let mut resumed: AdamW = AdamW::new(options);
    resumed.load_state_dict(&m2, &saved).expect("same model");
    for step in 1..3 {
        set_grads(&m1, step);
        set_grads(&m2, step);
        straight.step(&m1);
        resumed.step(&m2);
    }
    assert_eq!(bits(&m1.1), bits(&m2.1));
    assert_eq!(resumed.state_dict(), straight.state_dict());
    // Neither the saved state nor the optimizer it came from moved.
    assert_eq!(saved, copy);
    assert_eq!(first.state_dict(), copy);
}

#[test]
fn the_switch_turns_the_fused_path_off_on_this_thread_only() {
    assert!(super::fused::enabled::<f32>() && super::fused::enabled::<f64>());
    assert!(with_composed_only(|| !super::fused::enabled::<f32>()));
    assert!(super::fused::enabled::<f32>());
}
