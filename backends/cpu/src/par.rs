//! Forma's parallel loop: [`run`] calls `task(i)` for `i` in `0..n` on the
//! calling thread and on rayon's threads, which keep spinning between jobs.
//!
//! A training step or a layer's forward pass is a chain of ops of tens of
//! microseconds each. With rayon's own loops, every parallel op woke a
//! sleeping worker and put the calling thread to sleep until the work came
//! back: two wake-ups per op, each a few microseconds, more in a virtual
//! machine (where a wake-up is an interrupt between processors); they took
//! a sixth of an MLP training step. Here the caller computes tasks itself
//! and spins for the last ones, and the helpers are rayon tasks that, once
//! a job is done, spin for the next one for [`SPIN`] before they hand their
//! thread back to rayon: ops that follow each other closely find them
//! awake, and only the first op after an idle spell wakes a thread. The
//! caller claims tasks from the first up and helpers from the last down, so
//! each thread keeps to the same end of every op's range: the part of a
//! tensor one op writes on a core is, roughly, the part the next op reads
//! there (LeNet's training step 7-10% faster than with tasks claimed in
//! one order, measured on 2 cores).
//!
//! The threads are rayon's and so is their count (`RAYON_NUM_THREADS`, or
//! the pool the caller runs in), so one setting governs both. A task that
//! calls `run` again, and a call made while another thread's job holds the
//! helpers, run their tasks in order on the calling thread. Tasks never wait
//! for a helper: one that no helper has claimed is run by the caller.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it returns its thread
/// to rayon.
const SPIN: Duration = Duration::from_millis(1);

/// The threads a parallel op may use (the caller included).
pub(crate) fn threads() -> usize {
    rayon::current_num_threads()
}

/// Calls `task(i)` once for each `i` in `0..n`, in parallel over
/// [`threads`] threads, the caller's among them; returns when every call has
/// returned. A panic in a task is raised again here, after the others end.
pub(crate) fn run(n: usize, task: &(dyn Fn(usize) + Sync)) {
    let threads = threads().min(n);
    if threads <= 1 || INSIDE.get() || POOL.busy.swap(true, Acquire) {
        serial(n, task);
        return;
    }
    let job = Job {
        task,
        n,
        helpers: threads - 1,
        next: AtomicUsize::new(0),
        front: AtomicUsize::new(0),
        back: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        joined: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    // SAFETY (lifetime): `job` is erased to 'static for the helpers; they
    // only use it while counted in `active`, and it is unpublished below and
    // `active` drained before `job` is dropped.
    let ptr = (&job as *const Job<'_>).cast::<Job<'static>>().cast_mut();
    POOL.job.store(ptr, SeqCst);
    POOL.generation.fetch_add(1, SeqCst);
    POOL.summon(threads - 1);
    INSIDE.set(true);
    job.work(false);
    // Every task is claimed; wait for those that helpers are running.
    wait_until(|| job.done.load(Acquire) == n);
    POOL.job.store(std::ptr::null_mut(), SeqCst);
    wait_until(|| POOL.active.load(SeqCst) == 0);
    INSIDE.set(false);
    POOL.busy.store(false, Release);
    let panic = job.panic.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// [`run`] on this thread alone: every task runs, and a panic is raised
/// again after the others, as on the parallel path.
fn serial(n: usize, task: &(dyn Fn(usize) + Sync)) {
    let mut panic = None;
    for i in 0..n {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| task(i))) {
            panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// Spins until `done()`, yielding the core after a while in case the thread
/// waited for is kept off it.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < 1 << 14 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// Calls `f(first, piece)` over `out` cut into whole units of `unit`
/// elements (rows, lanes, blocks), `first` being the index of the piece's
/// first unit: one piece on this thread when `out` is small, else pieces
/// of about [`crate::PAR_CHUNK`] elements in parallel (see [`run`]).
pub(crate) fn units_mut<T: Send>(out: &mut [T], unit: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let len = out.len();
    if len >= 2 * crate::PAR_CHUNK && len > unit {
        let per = (crate::PAR_CHUNK / unit).max(1);
        chunks_mut(out, per * unit, |c, piece| f(c * per, piece));
    } else {
        f(0, out);
    }
}

/// Calls `f(i, piece)` for the `i`-th `chunk`-long piece of `out` (the last
/// may be shorter), in parallel (see [`run`]).
pub(crate) fn chunks_mut<T: Send>(out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    assert!(chunk > 0, "chunks_mut needs a positive chunk length");
    let len = out.len();
    let base = Shared(out.as_mut_ptr());
    run(len.div_ceil(chunk), &|i| {
        let start = i * chunk;
        // SAFETY: piece `i` is `out[start..start + chunk]` (clipped to
        // `out`), disjoint from every other piece, and `run` calls each
        // index once while the borrow of `out` is held.
        let piece = unsafe {
            std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start))
        };
        f(i, piece);
    });
}

/// [`chunks_mut`] that also collects `f`'s results, in the pieces' order.
pub(crate) fn chunks_map<T: Send, R: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R> {
    let mut results: Vec<Option<R>> = (0..out.len().div_ceil(chunk)).map(|_| None).collect();
    let slots = Shared(results.as_mut_ptr());
    chunks_mut(out, chunk, |i, piece| {
        let r = f(i, piece);
        // SAFETY: slot `i` belongs to piece `i` alone, and `results` outlives
        // the parallel loop.
        unsafe { *slots.get().add(i) = Some(r) };
    });
    results
        .into_iter()
        .map(|r| r.expect("every piece ran"))
        .collect()
}

/// Calls `f(&mut state, i)` for each `i` in `0..n`, in parallel: groups of
/// consecutive indices (at least `min` each, at most a few per thread), each
/// group with its own `state` from `init` (scratch buffers reused across the
/// group).
pub(crate) fn for_each_init<S>(
    n: usize,
    min: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) {
    let groups = (n / min.max(1)).clamp(1, 4 * threads());
    run(groups, &|g| {
        let mut state = init();
        for i in g * n / groups..(g + 1) * n / groups {
            f(&mut state, i);
        }
    });
}

/// Runs `a` and `b`, in parallel when a thread is free (see [`run`]).
pub(crate) fn join<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    let (fa, fb) = (Mutex::new(Some(a)), Mutex::new(Some(b)));
    let (ra, rb) = (Mutex::new(None), Mutex::new(None));
    run(2, &|i| {
        if i == 0 {
            call_once(&fa, &ra);
        } else {
            call_once(&fb, &rb);
        }
    });
    let ra = ra.into_inner().unwrap_or_else(|e| e.into_inner());
    let rb = rb.into_inner().unwrap_or_else(|e| e.into_inner());
    (
        ra.expect("join ran its first closure"),
        rb.expect("join ran its second closure"),
    )
}

/// Takes [`join`]'s closure from `f`, calls it and puts its result in `out`.
fn call_once<R>(f: &Mutex<Option<impl FnOnce() -> R>>, out: &Mutex<Option<R>>) {
    let f = f.lock().unwrap_or_else(|e| e.into_inner()).take();
    let r = f.map(|f| f());
    *out.lock().unwrap_or_else(|e| e.into_inner()) = r;
}

/// Calls `f(item)` for each of `items`, in parallel (see [`run`]).
pub(crate) fn each<T: Send>(items: Vec<T>, f: impl Fn(T) + Sync) {
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    chunks_mut(&mut slots, 1, |_, slot| {
        if let Some(item) = slot[0].take() {
            f(item);
        }
    });
}

/// A pointer the tasks of one [`run`] share, each using a disjoint part.
struct Shared<T>(*mut T);

impl<T> Shared<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: the tasks that share it write disjoint parts of what it points to
// (see `chunks_mut`), and `T: Send` lets those parts move between threads.
unsafe impl<T: Send> Sync for Shared<T> {}

thread_local! {
    /// Whether this thread is running a task of a job (a helper, or a caller
    /// inside `run`): a nested `run` is then serial.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// One call of [`run`]: the tasks and who has claimed and finished them.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    n: usize,
    /// Workers allowed to join (the caller is the other thread).
    helpers: usize,
    /// Tasks claimed so far, from either end.
    next: AtomicUsize,
    /// Tasks claimed from the front (by the caller), and from the back (by
    /// the helpers).
    front: AtomicUsize,
    back: AtomicUsize,
    done: AtomicUsize,
    joined: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claims and runs tasks until none is left: the caller from the first
    /// task up, helpers from the last one down. Each thread so works on one
    /// end of the tasks' range (the same end from job to job), and the parts
    /// of a tensor it writes in one op are, roughly, those it reads in the
    /// next, from its own caches.
    fn work(&self, from_back: bool) {
        loop {
            // At most `n` claims in all, so the two ends never overlap.
            if self.next.fetch_add(1, Relaxed) >= self.n {
                return;
            }
            let i = match from_back {
                false => self.front.fetch_add(1, Relaxed),
                true => self.n - 1 - self.back.fetch_add(1, Relaxed),
            };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.task)(i))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(payload);
            }
            self.done.fetch_add(1, Release);
        }
    }
}

/// The helpers' shared state.
struct Pool {
    /// The job being run, or null.
    job: AtomicPtr<Job<'static>>,
    /// Bumped when a job is published.
    generation: AtomicU64,
    /// Helpers between reading `job` and leaving it.
    active: AtomicUsize,
    /// Whether a caller owns the helpers (one job at a time).
    busy: AtomicBool,
    /// Helpers running (working or spinning for the next job).
    alive: AtomicUsize,
}

static POOL: Pool = Pool {
    job: AtomicPtr::new(std::ptr::null_mut()),
    generation: AtomicU64::new(0),
    active: AtomicUsize::new(0),
    busy: AtomicBool::new(false),
    alive: AtomicUsize::new(0),
};

impl Pool {
    /// Spawns rayon tasks until `want` helpers are alive (called after a
    /// job is published, so a new helper finds it).
    fn summon(&'static self, want: usize) {
        let mut alive = self.alive.load(SeqCst);
        while alive < want {
            match self
                .alive
                .compare_exchange(alive, alive + 1, SeqCst, SeqCst)
            {
                Ok(_) => {
                    rayon::spawn(move || self.help());
                    alive += 1;
                }
                Err(now) => alive = now,
            }
        }
    }

    /// A helper: joins the current job, then spins for the next one; after
    /// [`SPIN`] without one it returns (its thread goes back to rayon).
    fn help(&'static self) {
        INSIDE.set(true);
        let mut seen = None;
        loop {
            let g = self.generation.load(SeqCst);
            if seen != Some(g) {
                seen = Some(g);
                self.join_current();
            }
            if !self.spin_until_changed(g) {
                // Leaving: counted out first, then one more look, so a
                // caller that publishes after the look sees this helper
                // gone and summons another.
                self.alive.fetch_sub(1, SeqCst);
                if self.generation.load(SeqCst) == g {
                    break;
                }
                // A job came while leaving: stay for it.
                self.alive.fetch_add(1, SeqCst);
            }
        }
        INSIDE.set(false);
    }

    /// Works on the published job, if any, as one of its helpers.
    fn join_current(&self) {
        self.active.fetch_add(1, SeqCst);
        let ptr = self.job.load(SeqCst);
        if !ptr.is_null() {
            // SAFETY: a non-null `job` read while counted in `active`
            // stays alive until `active` is drained (see `run`).
            let job = unsafe { &*ptr };
            if job.joined.fetch_add(1, Relaxed) < job.helpers {
                job.work(true);
            }
        }
        self.active.fetch_sub(1, SeqCst);
    }

    /// Spins until the generation differs from `g` (true) or [`SPIN`]
    /// passes (false).
    fn spin_until_changed(&self, g: u64) -> bool {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if self.generation.load(Acquire) != g {
                return true;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_takes_the_first_tasks_and_helpers_the_last() {
        let caller = std::thread::current().id();
        for n in [2, 7, 64] {
            let by_caller: Vec<AtomicBool> = (0..n).map(|_| AtomicBool::new(false)).collect();
            run(n, &|i| {
                by_caller[i].store(std::thread::current().id() == caller, Relaxed);
                // Long enough for a helper to join.
                std::thread::sleep(Duration::from_micros(200));
            });
            let mine: Vec<bool> = by_caller.iter().map(|b| b.load(Relaxed)).collect();
            // The caller's tasks are a prefix, the helpers' the rest.
            let first = mine.iter().take_while(|&&b| b).count();
            assert!(mine[first..].iter().all(|&b| !b), "n = {n}: {mine:?}");
        }
    }

    #[test]
    fn every_task_runs_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            run(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut v = vec![0usize; 1003];
        chunks_mut(&mut v, 100, |i, piece| {
            for (k, x) in piece.iter_mut().enumerate() {
                *x = i * 100 + k;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| i == x));
    }

    #[test]
    fn helpers_give_each_result_its_place() {
        let mut v: Vec<usize> = (0..1000).collect();
        let sums = chunks_map(&mut v, 300, |i, piece| (i, piece.iter().sum::<usize>()));
        let want: Vec<(usize, usize)> = (0..4)
            .map(|i| (i, (300 * i..(300 * i + 300).min(1000)).sum()))
            .collect();
        assert_eq!(sums, want);

        let seen: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
        for_each_init(
            50,
            7,
            || 1,
            |one, i| {
                seen[i].fetch_add(*one, Relaxed);
            },
        );
        assert!(seen.iter().all(|s| s.load(Relaxed) == 1));

        assert_eq!(join(|| 6 * 7, || "b"), (42, "b"));

        let total = AtomicUsize::new(0);
        each((1..=10).collect(), |x: usize| {
            total.fetch_add(x, Relaxed);
        });
        assert_eq!(total.load(Relaxed), 55);
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..200 {
                        run(4, &|_| {
                            run(3, &|_| {
                                total.fetch_add(1, Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Relaxed), 3 * 200 * 4 * 3);
    }

    #[test]
    fn a_panic_reaches_the_caller_after_the_other_tasks() {
        // Eight tasks counted in `ran`, the sixth failing: whether the
        // call panicked.
        let eight_with_a_panic = |ran: &AtomicUsize| {
            catch_unwind(AssertUnwindSafe(|| {
                run(8, &|i| {
                    ran.fetch_add(1, Relaxed);
                    assert!(i != 5, "task five fails");
                })
            }))
            .is_err()
        };
        let ran = AtomicUsize::new(0);
        assert!(eight_with_a_panic(&ran));
        assert_eq!(ran.load(Relaxed), 8);
        // The same when the call runs serially (nested in a task).
        let ran = AtomicUsize::new(0);
        run(2, &|_| assert!(eight_with_a_panic(&ran)));
        assert_eq!(ran.load(Relaxed), 16);
        // The pool is usable afterwards.
        let after = AtomicUsize::new(0);
        run(8, &|_| {
            after.fetch_add(1, Relaxed);
        });
        assert_eq!(after.load(Relaxed), 8);
    }

    /// Whether, within a few tries, a job's two tasks ran on two threads at
    /// once (other tests may hold the helpers, so one try may run serially).
    fn a_helper_takes_a_task() -> bool {
        (0..200).any(|_| {
            let started = AtomicUsize::new(0);
            let ids = Mutex::new(Vec::new());
            run(2, &|_| {
                started.fetch_add(1, SeqCst);
                let t = Instant::now();
                while started.load(SeqCst) < 2 && t.elapsed() < Duration::from_millis(5) {
                    std::hint::spin_loop();
                }
                ids.lock().unwrap().push(std::thread::current().id());
            });
            let ids = ids.into_inner().unwrap();
            ids.len() == 2 && ids[0] != ids[1]
        })
    }

    #[test]
    fn tasks_run_on_two_threads() {
        if threads() < 2 {
            return;
        }
        assert!(a_helper_takes_a_task());
    }

    #[test]
    fn helpers_return_after_an_idle_spell_and_come_back() {
        run(2, &|_| {});
        std::thread::sleep(SPIN * 3);
        let hits = AtomicUsize::new(0);
        run(64, &|_| {
            hits.fetch_add(1, Relaxed);
        });
        assert_eq!(hits.load(Relaxed), 64);
        if threads() >= 2 {
            std::thread::sleep(SPIN * 3);
            assert!(a_helper_takes_a_task());
        }
    }
}
