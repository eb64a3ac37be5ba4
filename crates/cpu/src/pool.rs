//! A small persistent thread pool: `run(chunks, f)` calls `f(thread,
//! chunk)` once for every `chunk < chunks`, on the calling thread (thread
//! index 0) and the pool's workers, and returns when all calls have
//! finished.
//!
//! Chunks are claimed from an atomic counter, so a thread that the
//! operating system has descheduled (another process on the same cores)
//! does not hold up the op: the threads that run take its chunks. The
//! caller waits only for chunks already being computed. A decode step
//! dispatches a few hundred short jobs, so dispatch latency matters as much
//! as the jobs: workers spin on an atomic generation counter for a while
//! after each job (about a millisecond) before they sleep on a condition
//! variable. Dispatch allocates nothing, which keeps the decode path
//! allocation-free.
//!
//! A worker takes part in a job only after registering in `active` and
//! finding the job still open; `run` closes the job once every chunk is
//! claimed, then waits for `active` to drain before the job's closure goes
//! out of scope. With sequentially consistent orderings on `active` and
//! `closed`, either the caller sees the worker's registration and waits
//! for it, or the worker sees the job closed and never touches it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type JobRef = &'static (dyn Fn(usize, usize) + Sync);

/// How long an idle worker, or a caller waiting for workers, spins before
/// it sleeps (worker) or yields (caller).
const SPIN: Duration = Duration::from_millis(1);

struct Shared {
    /// The current job; written only by `run` while the job is closed and
    /// no worker is active.
    job: UnsafeCell<Option<JobRef>>,
    /// Chunks of the current job, and the next one to claim.
    chunks: AtomicUsize,
    next: AtomicUsize,
    /// No new worker may join the current job.
    closed: AtomicBool,
    /// Workers registered in the current job.
    active: AtomicUsize,
    generation: AtomicU64,
    /// Workers blocked (or about to block) on `wake`.
    sleeping: AtomicUsize,
    shutdown: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is only written by the dispatching thread while the job is
// closed and no worker is active (see the module docs); everything else is
// atomic or locked.
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
        if i.is_multiple_of(256) && start.elapsed() > SPIN {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Claims and runs chunks of the current job until none is left.
fn claim_chunks(sh: &Shared, job: &(dyn Fn(usize, usize) + Sync), thread: usize) {
    let chunks = sh.chunks.load(Ordering::Acquire);
    loop {
        let c = sh.next.fetch_add(1, Ordering::AcqRel);
        if c >= chunks {
            return;
        }
        job(thread, c);
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
            chunks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            closed: AtomicBool::new(true),
            active: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
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

    /// Calls `f(thread, chunk)` for every `chunk < chunks` on the pool's
    /// threads (`thread < threads()`; one thread never runs two calls at
    /// once) and waits. `f` must not call `run` itself.
    pub(crate) fn run(&self, chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        if self.workers.is_empty() || chunks <= 1 {
            (0..chunks).for_each(|c| f(0, c));
            return;
        }
        let _serial = lock(&self.dispatch);
        let sh = &*self.shared;
        // SAFETY: the erased reference is only used by workers registered
        // in `active` while the job is open; `Close` (also on unwind)
        // closes the job and waits for `active` to drain before this
        // function returns, so `f` outlives every use.
        let job: JobRef =
            unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), JobRef>(f) };
        // SAFETY: the previous job is closed and no worker is active in it
        // (its `Close` waited), so no worker reads `job` now.
        unsafe { *sh.job.get() = Some(job) };
        sh.chunks.store(chunks, Ordering::SeqCst);
        sh.next.store(0, Ordering::SeqCst);
        sh.closed.store(false, Ordering::SeqCst);
        sh.generation.fetch_add(1, Ordering::SeqCst);
        if sh.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = lock(&sh.sleep);
            sh.wake.notify_all();
        }
        let _close = Close(sh);
        claim_chunks(sh, f, 0);
    }
}

/// Closes the current job and waits for the workers still in it.
struct Close<'a>(&'a Shared);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        spin_until(|| self.0.active.load(Ordering::SeqCst) == 0);
        // SAFETY: the job is closed and no worker is active in it.
        unsafe { *self.0.job.get() = None };
    }
}

/// Deregisters a worker from the current job, also if the job panicked.
struct Leave<'a>(&'a Shared);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
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
        if !i.is_multiple_of(256) || start.elapsed() < SPIN {
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
        shared.active.fetch_add(1, Ordering::SeqCst);
        let _leave = Leave(shared);
        if shared.closed.load(Ordering::SeqCst) {
            continue;
        }
        // SAFETY: the job is open and this worker is registered, so `run`
        // wrote it before opening the job and keeps it until `active`
        // drains.
        let job = unsafe { *shared.job.get() };
        if let Some(job) = job {
            claim_chunks(shared, job, idx);
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
        let hits: Vec<AtomicUsize> = (0..7).map(|_| AtomicUsize::new(0)).collect();
        let busy: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            pool.run(7, &|thread, chunk| {
                assert_eq!(busy[thread].fetch_add(1, Ordering::SeqCst), 0);
                hits[chunk].fetch_add(1, Ordering::Relaxed);
                busy[thread].fetch_sub(1, Ordering::SeqCst);
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
