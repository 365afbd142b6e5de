//! Compile-fail tests: each file under `tests/ui/<category>/` is a shape
//! mistake that must be rejected by the compiler, and its `.stderr` file is the
//! exact error a user sees. The files under `tests/pass/` are the correct
//! counterparts, which must compile and run.
//!
//! Regenerate the expected output after changing a message:
//! `TRYBUILD=overwrite cargo test -p forma-ui-tests`, then review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();

    // Why the pass cases must stay in this same `TestCases`: trybuild compiles
    // the whole suite as one project and picks the cargo subcommand from its
    // contents. In trybuild 1.0.122 (src/cargo.rs, `build_dependencies`,
    // `build_test` and `build_all_tests`) the command is
    // `if project.has_pass { "build" } else { "check" }`, where `has_pass` is
    // set in src/run.rs (`prepare`) when any test is `Expected::Pass`. A suite
    // of only compile-fail cases therefore runs `cargo check`, which never
    // evaluates the const assertions behind `reshape`/`flatten` element
    // counts (they are post-monomorphization errors). Those cases would then
    // "compile" and fail the suite with "Expected test case to fail to
    // compile, but it succeeded." (checked by running the reshape cases
    // without the pass glob). With at least one pass case, every case runs
    // under `cargo build` and the element-count errors are reported.
    t.pass("tests/pass/*.rs");

    t.compile_fail("tests/ui/broadcast/*.rs");
    t.compile_fail("tests/ui/matmul/*.rs");
    t.compile_fail("tests/ui/reduce/*.rs");
    t.compile_fail("tests/ui/reshape/*.rs");
    t.compile_fail("tests/ui/view/*.rs");
    t.compile_fail("tests/ui/dims/*.rs");
    t.compile_fail("tests/ui/derive/*.rs");
    t.compile_fail("tests/ui/cat/*.rs");
    t.compile_fail("tests/ui/select/*.rs");
    t.compile_fail("tests/ui/index/*.rs");
    t.compile_fail("tests/ui/dtype/*.rs");
    t.compile_fail("tests/ui/conv/*.rs");
    t.compile_fail("tests/ui/layers/*.rs");
    t.compile_fail("tests/ui/hf/*.rs");
    t.compile_fail("tests/ui/loss/*.rs");
}
