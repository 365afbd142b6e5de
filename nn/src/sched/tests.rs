//! Scheduler options and state checks. (Their learning rates against
//! PyTorch are in `tests/suite/nn_optim_parity.rs`.)

use super::*;
use crate::optim::{Sgd, SgdOptions};

fn sgd() -> Sgd {
    Sgd::new(SgdOptions::default().lr(0.1).momentum(0.9))
}

#[test]
fn invalid_options_are_refused() {
    let mut o = sgd();
    assert!(StepLR::try_new(&mut o, 0, 0.1).is_err());
    assert!(LinearLR::try_new(&mut o, 0.0, 1.0, 5).is_err());
    assert!(LinearLR::try_new(&mut o, 0.5, 1.5, 5).is_err());
    assert!(CosineAnnealingLR::try_new(&mut o, 0, 0.0).is_err());
    assert!(OneCycleLR::try_new(&mut o, OneCycleOptions::new(1.0, 0)).is_err());
    assert!(OneCycleLR::try_new(&mut o, OneCycleOptions::new(1.0, 10).pct_start(1.5)).is_err());
    assert!(OneCycleLR::try_new(
        &mut o,
        OneCycleOptions::new(1.0, 10).max_lrs(vec![1.0, 2.0])
    )
    .is_err());
    let a = StepLR::new(&mut o, 2, 0.5);
    let b = StepLR::new(&mut o, 2, 0.5);
    assert!(SequentialLR::try_new(&mut o, vec![Box::new(a), Box::new(b)], vec![]).is_err());
    assert!(SequentialLR::try_new(&mut o, vec![], vec![]).is_err());
}

#[test]
fn sequential_needs_an_attached_scheduler() {
    // Without a scheduler built on it first, the optimizer has no initial_lr.
    let mut o = sgd();
    let mut other = sgd();
    let s = StepLR::new(&mut other, 2, 0.5);
    assert!(matches!(
        SequentialLR::try_new(&mut o, vec![Box::new(s)], vec![]),
        Err(OptimError::MissingKey(_))
    ));
}

#[test]
fn a_scheduler_refuses_an_optimizer_with_other_groups() {
    use crate::optim::{ParamGroup, Select};
    let mut o = sgd();
    let mut s = ExponentialLR::new(&mut o, 0.5);
    let mut two: Sgd = Sgd::with_groups(vec![
        ParamGroup::new(Select::all(), SgdOptions::default()),
        ParamGroup::new(Select::all(), SgdOptions::default()),
    ]);
    assert!(matches!(
        s.try_step(&mut two),
        Err(OptimError::GroupCount { .. })
    ));
}

#[test]
fn state_loads_are_checked_and_all_or_nothing() {
    let mut o = sgd();
    let mut s = CosineAnnealingLR::new(&mut o, 10, 0.0);
    s.step(&mut o);
    let st = s.state_dict();
    assert_eq!(st.meta["scheduler"], "CosineAnnealingLR");
    assert_eq!(st.meta["last_epoch"], "1");
    assert_eq!(st.meta["T_max"], "10");
    let before = s.clone();
    let mut bad = st.clone();
    bad.meta.remove("eta_min");
    assert!(matches!(
        s.load_state_dict(&bad),
        Err(OptimError::MissingKey(_))
    ));
    let mut bad = st.clone();
    bad.meta.insert("gamma".into(), "0.5".into());
    assert!(matches!(
        s.load_state_dict(&bad),
        Err(OptimError::UnexpectedKey { .. })
    ));
    let mut bad = st.clone();
    bad.meta.insert("last_epoch".into(), "soon".into());
    assert!(matches!(
        s.load_state_dict(&bad),
        Err(OptimError::BadValue { .. })
    ));
    assert_eq!(s, before);
    let mut step = StepLR::new(&mut o, 1, 0.5);
    assert!(matches!(
        step.load_state_dict(&st),
        Err(OptimError::WrongKind { .. })
    ));

    // A SequentialLR whose second scheduler's state is bad keeps the first's.
    let mut o = sgd();
    let w = LinearLR::new(&mut o, 0.5, 1.0, 2);
    let c = CosineAnnealingLR::new(&mut o, 4, 0.0);
    let mut seq = SequentialLR::new(&mut o, vec![Box::new(w), Box::new(c)], vec![2]);
    seq.step(&mut o);
    let good = seq.state_dict();
    seq.step(&mut o);
    let later = seq.state_dict();
    let mut bad = good.clone();
    bad.meta.insert("schedulers.1.T_max".into(), "x".into());
    assert!(seq.load_state_dict(&bad).is_err());
    assert_eq!(seq.state_dict(), later);
    seq.load_state_dict(&good).expect("its own state");
    assert_eq!(seq.state_dict(), good);
}
