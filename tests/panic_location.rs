//! The plain forms of ops that can fail on `Dyn` sizes are
//! `#[track_caller]`: their panic names the caller's line, not a line inside
//! Forma. One test in its own binary, because it swaps the panic hook.

use forma::nn::loss::{mse_loss, Mean};
use forma::prelude::*;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;

static LOCATION: Mutex<Option<(String, u32)>> = Mutex::new(None);

/// The file and line a panic in `f` reports.
fn panic_location(f: impl FnOnce()) -> (String, u32) {
    panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| (l.file().to_string(), l.line()));
        *LOCATION.lock().unwrap() = at;
    }));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    drop(panic::take_hook());
    assert!(result.is_err(), "expected a panic");
    LOCATION.lock().unwrap().take().expect("a location")
}

#[test]
fn plain_ops_panic_at_the_callers_line() {
    let a = Tensor::<(Dyn, Dyn)>::zeros_with((Dyn(2), Dyn(3)));
    let b = Tensor::<(Dyn, Dyn)>::zeros_with((Dyn(4), Dyn(5)));
    let here = file!().to_string();
    let cases: Vec<(&str, u32, (String, u32))> = vec![
        ("+", line!(), panic_location(|| drop(&a + &b))),
        ("add", line!(), panic_location(|| drop(a.add(&b)))),
        ("matmul", line!(), panic_location(|| drop(a.matmul(&b)))),
        (
            "reshape",
            line!(),
            panic_location(|| drop(a.reshape::<(Dyn, C<4>)>())),
        ),
        (
            "mse_loss",
            line!(),
            panic_location(|| drop(mse_loss(&a, &b, Mean))),
        ),
        (
            "cat",
            line!(),
            panic_location(|| drop(forma::cat::<0, _, _>(&[&a, &b].map(|t| t.clone())))),
        ),
        (
            "narrow",
            line!(),
            panic_location(|| drop(a.narrow::<1>(2, 5))),
        ),
    ];
    for (op, line, (file, at)) in cases {
        assert_eq!(file, here, "{op} panicked in {file}:{at}");
        assert!(
            (line..line + 3).contains(&at),
            "{op} panicked at line {at}, not its case's (line {line})"
        );
    }
}
