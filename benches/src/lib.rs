//! Shared timing helpers for the benches in `benches/`: each bench prints
//! medians; nothing here asserts a time.

use std::time::Instant;

/// Runs `f` `warmup` times, then `rounds` timed times, and returns the median
/// seconds per call.
pub fn median_secs(warmup: usize, rounds: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let mut t: Vec<f64> = (0..rounds)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}
