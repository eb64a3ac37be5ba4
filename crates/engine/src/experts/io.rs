//! The persistent I/O pool that reads a layer's missing experts in parallel.
//!
//! [`IoPool::run`] takes one batch of [`ReadJob`]s (the misses of one group
//! of one layer), lets the pool threads and the calling thread claim jobs
//! until none is left, and returns when every job has finished, with the
//! first failure if any. Each job is one positioned read (`pread`) of one
//! expert record into its slot; jobs of a batch write disjoint slots.
//!
//! Nothing here allocates after [`IoPool::new`]: the job list has a fixed
//! capacity, synchronisation is a mutex and two condition variables, and a
//! failed read's `io::Error` carries an OS code or a static kind.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// One positioned read of `len` bytes at `offset` of `file` into `dst`.
pub(crate) struct ReadJob {
    pub file: Arc<File>,
    pub offset: u64,
    /// Start of the destination slot, inside an `AlignedBuf`.
    pub dst: *mut u8,
    pub len: usize,
}

// SAFETY: `dst` points into a slot buffer that outlives the batch (the
// submitting session owns the buffer and waits in `IoPool::run` until every
// job has finished), and the slots of one batch are disjoint, so moving a job
// to another thread hands that thread exclusive use of its destination.
unsafe impl Send for ReadJob {}

impl ReadJob {
    fn duplicate(&self) -> ReadJob {
        ReadJob {
            file: Arc::clone(&self.file),
            offset: self.offset,
            dst: self.dst,
            len: self.len,
        }
    }

    /// Reads the whole record; a file that ends first is `UnexpectedEof`.
    fn execute(&self) -> io::Result<()> {
        // SAFETY: see the `Send` impl: `dst .. dst + len` lies inside a live
        // slot buffer (the slot layout is checked against the buffer once,
        // when the slots are made) that no other job of the batch and no
        // reader touches until the batch completes.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.dst, self.len) };
        let mut done = 0;
        while done < buf.len() {
            match self
                .file
                .read_at(&mut buf[done..], self.offset + done as u64)
            {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

struct State {
    jobs: Vec<ReadJob>,
    /// Next job to claim.
    next: usize,
    /// Jobs claimed or not whose read has not finished.
    unfinished: usize,
    /// The first failed job and its error.
    failure: Option<(usize, io::Error)>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Jobs were posted, or the pool is shutting down.
    wake: Condvar,
    /// The last job of a batch finished.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked; the state is still
        // consistent (every field is updated under the lock in one step).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims and runs jobs until none is left to claim.
    fn work<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while st.next < st.jobs.len() {
            let i = st.next;
            st.next += 1;
            let job = st.jobs[i].duplicate();
            drop(st);
            let result = job.execute();
            drop(job);
            st = self.lock();
            if let Err(e) = result {
                if st.failure.is_none() {
                    st.failure = Some((i, e));
                }
            }
            st.unfinished -= 1;
            if st.unfinished == 0 {
                self.done.notify_all();
            }
        }
        st
    }
}

/// Reader threads that live as long as their session.
pub(crate) struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    capacity: usize,
}

impl IoPool {
    /// A pool of `threads` reader threads besides the caller's, for batches
    /// of at most `max_jobs` reads.
    pub(crate) fn new(threads: usize, max_jobs: usize) -> io::Result<IoPool> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: Vec::with_capacity(max_jobs),
                next: 0,
                unfinished: 0,
                failure: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let mut pool = IoPool {
            shared,
            threads: Vec::with_capacity(threads),
            capacity: max_jobs,
        };
        // Each thread's runtime start-up allocates; waiting until all have
        // started keeps that out of the first reads of a decode.
        let started = Arc::new(std::sync::Barrier::new(threads + 1));
        for i in 0..threads {
            let shared = Arc::clone(&pool.shared);
            let started = Arc::clone(&started);
            let handle = std::thread::Builder::new()
                .name(format!("turbospark-io-{i}"))
                .spawn(move || {
                    started.wait();
                    let mut st = shared.lock();
                    loop {
                        if st.shutdown {
                            return;
                        }
                        if st.next < st.jobs.len() {
                            st = shared.work(st);
                            continue;
                        }
                        st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                    }
                })?;
            pool.threads.push(handle);
        }
        started.wait();
        Ok(pool)
    }

    /// Runs one batch; on failure returns the index (in `jobs` order) of
    /// the first job that failed and its error. Every job has finished when
    /// this returns, failed or not.
    ///
    /// At most `max_jobs` jobs (see [`IoPool::new`]); more is an
    /// `InvalidInput` error before any read.
    pub(crate) fn run(
        &self,
        jobs: impl ExactSizeIterator<Item = ReadJob>,
    ) -> Result<(), (usize, io::Error)> {
        if jobs.len() > self.capacity {
            return Err((0, io::ErrorKind::InvalidInput.into()));
        }
        let sh = &*self.shared;
        let mut st = sh.lock();
        st.jobs.clear();
        st.jobs.extend(jobs);
        let n = st.jobs.len();
        if n == 0 {
            return Ok(());
        }
        st.next = 0;
        st.unfinished = n;
        st.failure = None;
        if n > 1 && !self.threads.is_empty() {
            sh.wake.notify_all();
        }
        st = sh.work(st);
        while st.unfinished > 0 {
            st = sh.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.jobs.clear();
        match st.failure.take() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            // A reader thread that panicked has nothing left to clean up.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::aligned::AlignedBuf;
    use std::io::Write;

    #[test]
    fn reads_in_parallel_and_reports_the_failing_job() {
        let path = std::env::temp_dir().join(format!("ts-io-pool-{}", std::process::id()));
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&data)
            .unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let buf = AlignedBuf::zeroed(16 * 4096).unwrap();
        let pool = IoPool::new(3, 16).unwrap();
        for round in 0..4 {
            let jobs = (0..16).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: ((j + round) % 16) as u64 * 4096,
                dst: buf.region(j * 4096, 4096).unwrap(),
                len: 4096,
            });
            pool.run(jobs).unwrap();
            for j in 0..16 {
                let at = ((j + round) % 16) * 4096;
                assert_eq!(
                    &buf.as_ref()[j * 4096..(j + 1) * 4096],
                    &data[at..at + 4096]
                );
            }
        }
        // Job 1 reads past the end of the file.
        let jobs = (0..3).map(|j| ReadJob {
            file: Arc::clone(&file),
            offset: if j == 1 { 63 * 1024 } else { 0 },
            dst: buf.region(j * 4096, 4096).unwrap(),
            len: 4096,
        });
        let (i, e) = pool.run(jobs).unwrap_err();
        assert_eq!(i, 1);
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let too_many = (0..17).map(|_| ReadJob {
            file: Arc::clone(&file),
            offset: 0,
            dst: buf.region(0, 1).unwrap(),
            len: 1,
        });
        assert!(pool.run(too_many).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
