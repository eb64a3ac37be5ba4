//! A small persistent thread pool: `run(f)` calls `f(i)` once for every
//! thread index `i` in `0..threads()` (index 0 on the calling thread) and
//! returns when all calls have finished.
//!
//! Dispatch allocates nothing (a mutex, two condition variables and a
//! generation counter), which keeps the decode path allocation-free; spawning
//! scoped threads per op would allocate on every call.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

type JobRef = &'static (dyn Fn(usize) + Sync);

struct State {
    job: Option<JobRef>,
    generation: u64,
    pending: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A poisoned lock only means a job panicked; the counters stay usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
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
            state: Mutex::new(State {
                job: None,
                generation: 0,
                pending: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
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
        let _serial = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the erased reference is only used by workers between the
        // generation bump below and their `pending` decrement; `Wait` (also
        // on unwind) blocks until `pending` is 0 and clears the job before
        // this function returns, so `f` outlives every use.
        let job: JobRef = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), JobRef>(f) };
        {
            let mut st = lock(&self.shared.state);
            st.job = Some(job);
            st.generation = st.generation.wrapping_add(1);
            st.pending = self.workers.len();
        }
        self.shared.wake.notify_all();
        let _wait = Wait(&self.shared);
        f(0);
    }
}

/// Waits for the workers of the current job and clears it.
struct Wait<'a>(&'a Shared);

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        while st.pending > 0 {
            st = self.0.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.job = None;
    }
}

/// Marks a worker's share of the job done, also if the job panicked.
struct Finish<'a>(&'a Shared);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.pending -= 1;
        if st.pending == 0 {
            self.0.done.notify_all();
        }
    }
}

fn worker(shared: &Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut st = lock(&shared.state);
            while st.generation == seen && !st.shutdown {
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            st.job
        };
        if let Some(job) = job {
            let _finish = Finish(shared);
            job(idx);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.wake.notify_all();
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
