//! Shared timing and reporting for the benches in `benches/`: each bench
//! prints figures; nothing here asserts a time.
//!
//! The side-by-side suite (`benches/suite.rs`) describes each workload once
//! ([`Workload`]), measures Forma in-process and PyTorch through
//! `benches/suite.py` ([`Torch`]), one row at a time on both sides, and
//! prints one [`Table`] with the ratio and target.

use forma::Rng;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The least time a measurement spends in warm-up calls: a few calls of a
/// product of microseconds are not enough for the caches, the clock and the
/// worker threads to settle (after the other framework's turn, say).
pub const WARMUP_SECS: f64 = 0.05;

/// Runs `f` `warmup` times (at least; see [`Sample::time`]), then `rounds`
/// timed times, and returns the median seconds per call.
pub fn median_secs(warmup: usize, rounds: usize, f: impl FnMut()) -> f64 {
    Sample::time(warmup, rounds, f).median() / 1e3
}

/// The repetitions of one measurement, in the unit of its [`Workload`].
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// One value per timed repetition.
    pub values: Vec<f64>,
}

impl Sample {
    /// Milliseconds per call of `f`, after untimed warm-up calls: at least
    /// `warmup` of them, and for at least [`WARMUP_SECS`] (`benches/suite.py`
    /// warms PyTorch up the same way).
    pub fn time(warmup: usize, reps: usize, mut f: impl FnMut()) -> Sample {
        let start = Instant::now();
        let mut calls = 0;
        while calls < warmup || start.elapsed().as_secs_f64() < WARMUP_SECS {
            f();
            calls += 1;
        }
        let values = (0..reps)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        Sample { values }
    }

    /// A single measured value (a memory figure).
    pub fn value(v: f64) -> Sample {
        Sample { values: vec![v] }
    }

    /// Turns milliseconds per call into `work` units per second (GFLOP/s
    /// for `work` in GFLOP, GB/s for `work` in GB).
    pub fn rate(self, work: f64) -> Sample {
        Sample {
            values: self.values.iter().map(|ms| work / (ms / 1e3)).collect(),
        }
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .values
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The median (NaN when empty).
    pub fn median(&self) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        v[v.len() / 2]
    }

    /// The smallest and largest values.
    pub fn min_max(&self) -> (f64, f64) {
        let v = self.sorted();
        (
            v.first().copied().unwrap_or(f64::NAN),
            v.last().copied().unwrap_or(f64::NAN),
        )
    }
}

/// What a workload's figure measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// GFLOP/s, higher is better.
    Gflops,
    /// GB/s, higher is better.
    GBps,
    /// Milliseconds per call, lower is better.
    Millis,
    /// Megabytes, lower is better.
    Megabytes,
    /// Generated tokens per second, higher is better.
    TokensPerSec,
}

impl Unit {
    fn higher_is_better(self) -> bool {
        matches!(self, Unit::Gflops | Unit::GBps | Unit::TokensPerSec)
    }

    fn label(self) -> &'static str {
        match self {
            Unit::Gflops => "GFLOP/s",
            Unit::GBps => "GB/s",
            Unit::Millis => "ms",
            Unit::Megabytes => "MB",
            Unit::TokensPerSec => "tok/s",
        }
    }
}

/// One row of the suite: a key shared with `suite.py`, a label, the unit,
/// the target as a ratio Forma/PyTorch (at least it for higher-is-better
/// units, at most it otherwise) and Forma's measurement.
pub struct Workload {
    key: String,
    label: String,
    unit: Unit,
    target: f64,
    run: Box<dyn FnMut(&mut Rng) -> Sample>,
    forma: Sample,
    torch: Sample,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload").field("key", &self.key).finish()
    }
}

impl Workload {
    /// A row; `run` measures Forma once (one round).
    pub fn new(
        key: &str,
        label: &str,
        unit: Unit,
        target: f64,
        run: Box<dyn FnMut(&mut Rng) -> Sample>,
    ) -> Workload {
        Workload {
            key: key.to_string(),
            label: label.to_string(),
            unit,
            target,
            run,
            forma: Sample::default(),
            torch: Sample::default(),
        }
    }
}

/// The suite's rows and what was measured for them.
#[derive(Debug)]
pub struct Table {
    rows: Vec<Workload>,
}

impl Table {
    /// The rows whose key contains one of `only`'s comma-separated parts
    /// (all of them without a filter).
    pub fn new(rows: Vec<Workload>, only: Option<&str>) -> Table {
        let rows = rows
            .into_iter()
            .filter(|w| only.is_none_or(|o| o.split(',').any(|p| w.key.contains(p))))
            .collect();
        Table { rows }
    }

    /// Measures every row once on each side, back to back: Forma then
    /// PyTorch, or the other way round when `torch_first` (alternate it
    /// between rounds). On a shared machine whose speed drifts over tens
    /// of seconds, both sides of a row are then measured under the same
    /// conditions. A short pause before each measurement lets the other
    /// side's worker threads stop spinning.
    pub fn run_round(&mut self, rng: &mut Rng, mut torch: Option<&mut Torch>, torch_first: bool) {
        for w in &mut self.rows {
            for side in [torch_first, !torch_first] {
                std::thread::sleep(Duration::from_millis(100));
                if !side {
                    let s = (w.run)(rng);
                    w.forma.values.extend(s.values);
                } else if let Some(t) = torch.as_deref_mut() {
                    w.torch.values.extend(t.measure(&w.key));
                }
            }
        }
    }

    /// Prints the table: medians with [min, max], the ratio Forma/PyTorch,
    /// the target and whether it is met; GFLOP/s rows also show the share
    /// of `peak_gflops`.
    pub fn print(&self, peak_gflops: f64) {
        println!(
            "\n{:<34} {:>8} {:>26} {:>26} {:>7} {:>8}  status",
            "workload",
            "unit",
            "forma median [min-max]",
            "pytorch median [min-max]",
            "ratio",
            "target"
        );
        for w in &self.rows {
            let cell = |s: &Sample| {
                let (lo, hi) = s.min_max();
                if s.values.is_empty() {
                    "absent".to_string()
                } else {
                    format!("{:.2} [{:.2}-{:.2}]", s.median(), lo, hi)
                }
            };
            let ratio = w.forma.median() / w.torch.median();
            let (target, met) = if w.unit.higher_is_better() {
                (format!(">= {:.2}", w.target), ratio >= w.target)
            } else {
                (format!("<= {:.2}", w.target), ratio <= w.target)
            };
            let status = if ratio.is_nan() {
                "no comparison".to_string()
            } else if met {
                "met".to_string()
            } else {
                "NOT met".to_string()
            };
            let peak = if w.unit == Unit::Gflops {
                format!("  ({:.0}% of peak)", 100.0 * w.forma.median() / peak_gflops)
            } else {
                String::new()
            };
            println!(
                "{:<34} {:>8} {:>26} {:>26} {:>7.2} {:>8}  {status}{peak}",
                w.label,
                w.unit.label(),
                cell(&w.forma),
                cell(&w.torch),
                ratio,
                target
            );
        }
    }
}

/// PyTorch's side of the suite: `benches/suite.py --serve` in a child
/// process, asked for one workload at a time (its key on a line) and
/// answering `key<TAB>v1,v2,...` in the workload's unit.
#[derive(Debug)]
pub struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Torch {
    /// Starts the script with `threads` threads; `None` (and why, on
    /// stderr) if it cannot run.
    pub fn start(threads: usize) -> Option<Torch> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/suite.py");
        let child = Command::new("python3")
            .arg(script)
            .args(["--threads", &threads.to_string(), "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                eprintln!("could not run suite.py: {e}");
                return None;
            }
        };
        let stdin = child.stdin.take()?;
        let stdout = BufReader::new(child.stdout.take()?);
        Some(Torch {
            child,
            stdin,
            stdout,
        })
    }

    /// The values PyTorch measured for the workload `key` (none if the
    /// script does not know it or has failed).
    pub fn measure(&mut self, key: &str) -> Vec<f64> {
        let mut line = String::new();
        let asked = writeln!(self.stdin, "{key}").and_then(|()| self.stdin.flush());
        if asked.is_err() || self.stdout.read_line(&mut line).unwrap_or(0) == 0 {
            eprintln!("suite.py stopped answering (at {key:?})");
            return Vec::new();
        }
        // Only the line break goes: a key with no values ends in its tab.
        match line.trim_end_matches(['\r', '\n']).split_once('\t') {
            Some((k, vals)) if k == key => vals
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect(),
            _ => {
                eprintln!("suite.py answered {line:?} for {key:?}");
                Vec::new()
            }
        }
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        // The script waits on its stdin for the next key: end it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// This process's peak resident set size in MB (`VmHWM`), where the OS
/// reports it (Linux).
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Minor page faults of this process so far (Linux): each is a page the
/// process touched for the first time, so their growth over a steady-state
/// training step measures how much fresh memory the step takes.
pub fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; minflt is field 10.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_median() {
        let s = Sample {
            values: vec![2.0, 1.0, 4.0],
        };
        assert_eq!(s.median(), 2.0);
        assert_eq!(s.min_max(), (1.0, 4.0));
        // 1 GFLOP in 2 ms is 500 GFLOP/s.
        assert_eq!(s.rate(1.0).values, vec![500.0, 1000.0, 250.0]);
    }

    #[test]
    fn peak_rss_is_reported_on_linux() {
        if cfg!(target_os = "linux") {
            let mb = peak_rss_mb().unwrap();
            assert!(mb > 0.5 && mb < 100_000.0, "{mb}");
            let before = minor_faults().unwrap();
            let v = std::hint::black_box(vec![1u8; 64 << 20]);
            let after = minor_faults().unwrap();
            // 64 MiB touched is at least a few thousand fresh pages.
            assert!(after - before > 1000, "{before} -> {after}");
            drop(v);
        }
    }
}
