//! A small persistent thread pool: `run(f)` calls `f(i)` once for every
//! thread index `i` in `0..threads()` (index 0 on the calling thread) and
//! returns when all calls have finished.
//!
//! A decode step dispatches a few hundred short jobs, so dispatch latency
//! matters as much as the jobs: workers spin on an atomic generation
//! counter for a while after each job (about a millisecond) before they
//! sleep on a condition variable, and the caller spins on the count of
//! unfinished workers. Dispatch allocates nothing, which keeps the decode
//! path allocation-free; spawning scoped threads per op would allocate on
//! every call.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type JobRef = &'static (dyn Fn(usize) + Sync);

/// How long an idle worker, or a caller waiting for workers, spins before
/// it sleeps (worker) or yields (caller).
const SPIN: Duration = Duration::from_millis(1);

struct Shared {
    /// The current job; written only by `run` while no worker reads it
    /// (before the generation bump that publishes it, after `pending`
    /// reached 0).
    job: UnsafeCell<Option<JobRef>>,
    generation: AtomicU64,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Workers blocked (or about to block) on `wake`.
    sleeping: AtomicUsize,
    shutdown: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the dispatching thread while no worker
// reads it (see the field's doc); everything else is atomic or locked.
unsafe impl Sync for Shared {}

fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    // A poisoned lock only means a job panicked; it guards no data.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spins until `done()` holds; after [`SPIN`], yields between checks.
fn spin_until(done: impl Fn() -> bool) {
    let start = Instant::now();
    let mut i = 0u32;
    while !done() {
        i = i.wrapping_add(1);
        if i % 256 == 0 && start.elapsed() > SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

pub(crate) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises `run` calls from different threads.
    dispatch: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` threads in total (the caller counts as one).
    pub(crate) fn new(threads: usize) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::new();
        // Each thread's runtime start-up allocates; waiting until all have
        // started keeps that out of the first ops of a decode.
        let started = Arc::new(std::sync::Barrier::new(threads.max(1)));
        for idx in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let started = Arc::clone(&started);
            let handle = std::thread::Builder::new()
                .name(format!("turbospark-cpu-{idx}"))
                .spawn(move || {
                    started.wait();
                    worker(&s, idx)
                })?;
            workers.push(handle);
        }
        started.wait();
        Ok(Pool {
            shared,
            workers,
            dispatch: Mutex::new(()),
        })
    }

    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Calls `f(i)` for every `i < threads()`, concurrently, and waits.
    /// `f` must not call `run` itself.
    pub(crate) fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let _serial = lock(&self.dispatch);
        let sh = &*self.shared;
        // SAFETY: the erased reference is only used by workers between the
        // generation bump below and their `pending` decrement; `Wait` (also
        // on unwind) spins until `pending` is 0 and clears the job before
        // this function returns, so `f` outlives every use.
        let job: JobRef = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), JobRef>(f) };
        // SAFETY: no worker reads `job` now: the previous job's workers all
        // finished (`pending` was 0) and the new generation is not yet
        // published.
        unsafe { *sh.job.get() = Some(job) };
        sh.pending.store(self.workers.len(), Ordering::SeqCst);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        if sh.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = lock(&sh.sleep);
            sh.wake.notify_all();
        }
        let _wait = Wait(sh);
        f(0);
    }
}

/// Waits for the workers of the current job and clears it.
struct Wait<'a>(&'a Shared);

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        spin_until(|| self.0.pending.load(Ordering::Acquire) == 0);
        // SAFETY: every worker has finished the job; none reads it until
        // the next generation.
        unsafe { *self.0.job.get() = None };
    }
}

/// Marks a worker's share of the job done, also if the job panicked.
struct Finish<'a>(&'a Shared);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Release);
    }
}

/// Waits until the generation differs from `seen` (or shutdown), spinning
/// first, then sleeping; returns the new generation, `None` on shutdown.
fn next_generation(sh: &Shared, seen: u64) -> Option<u64> {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        if sh.shutdown.load(Ordering::Acquire) {
            return None;
        }
        let g = sh.generation.load(Ordering::Acquire);
        if g != seen {
            return Some(g);
        }
        i = i.wrapping_add(1);
        if i % 256 != 0 || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        let mut guard = lock(&sh.sleep);
        sh.sleeping.fetch_add(1, Ordering::SeqCst);
        // Re-checked after announcing the sleep: `run` bumps the generation
        // before it reads `sleeping`, so one of the two sees the other.
        while sh.generation.load(Ordering::SeqCst) == seen && !sh.shutdown.load(Ordering::SeqCst) {
            guard = sh.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        sh.sleeping.fetch_sub(1, Ordering::SeqCst);
    }
}

fn worker(shared: &Shared, idx: usize) {
    let mut seen = 0u64;
    while let Some(g) = next_generation(shared, seen) {
        seen = g;
        // SAFETY: `run` wrote the job before publishing generation `g`
        // (acquired above) and clears it only after this worker's
        // `Finish`.
        let job = unsafe { *shared.job.get() };
        if let Some(job) = job {
            let _finish = Finish(shared);
            job(idx);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = lock(&self.shared.sleep);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The `part`-th of `parts` nearly equal contiguous ranges of `0..total`.
pub(crate) fn split(total: usize, parts: usize, part: usize) -> std::ops::Range<usize> {
    let parts = parts.max(1);
    let base = total / parts;
    let extra = total % parts;
    let start = part * base + part.min(extra);
    let len = base + usize::from(part < extra);
    start.min(total)..(start + len).min(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_index_runs_once_per_call() {
        let pool = Pool::new(3).unwrap();
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            pool.run(&|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 50);
        }
    }

    #[test]
    fn split_covers_the_range() {
        for total in [0, 1, 5, 17] {
            for parts in 1..5 {
                let mut next = 0;
                for p in 0..parts {
                    let r = split(total, parts, p);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, total);
            }
        }
    }
}
