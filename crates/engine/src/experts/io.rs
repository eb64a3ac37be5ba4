//! The persistent I/O pool that reads a layer's missing experts in parallel.
//!
//! [`IoPool::submit`] posts one batch of [`ReadJob`]s (the misses of one
//! group of one layer) to the pool threads and returns at once with a
//! [`Pending`] batch; the caller may compute meanwhile (on the experts it
//! already has), then [`Pending::wait`] lets the calling thread claim the
//! jobs still unclaimed and returns when every job has finished, with the
//! first failure if any, and how long the reads took and how long the
//! caller waited; [`Pending::wait_job`] returns as soon as one job is
//! read, so the caller can hand that expert on (to the device) while the
//! others are still being read, and [`Pending::wait_prefix`] as soon as a
//! job's first bytes are, so the caller can hand on the start of an expert
//! while its end is still being read. Each job is one
//! expert record read into its slot; jobs of a batch write disjoint slots.
//! A job is read in pieces of at most [`PIECE_BYTES`] (positioned reads,
//! `pread`), which the threads claim one by one, in order: a layer that
//! misses one expert has it read by every thread at once rather than by
//! one (a single thread copies a record out of the page cache at a few
//! GB/s), front to back, so that its first bytes are ready well before its
//! last.
//!
//! Nothing here allocates after [`IoPool::new`]: the job list has a fixed
//! capacity, synchronisation is a mutex and two condition variables, and a
//! failed read's `io::Error` carries an OS code or a static kind.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of a piece of a job (a multiple of 4096, so that the pieces of a
/// direct-I/O job stay aligned as the job is). Small enough that a
/// 13 MB expert is some fifty pieces, several per thread, which then
/// finish roughly front to back ([`Pending::wait_prefix`]); large enough
/// that a piece's copy dwarfs its system call and its turn at the lock.
pub(crate) const PIECE_BYTES: usize = 256 << 10;

/// One read of `len` bytes at `offset` of `file` into `dst`.
pub(crate) struct ReadJob {
    pub file: Arc<File>,
    pub offset: u64,
    /// Start of the destination slot, inside an `AlignedBuf`.
    pub dst: *mut u8,
    pub len: usize,
}

// SAFETY: `dst` points into a slot buffer that outlives the batch (the
// submitting session owns the buffer and waits in `Pending::wait`, or in
// `Pending`'s drop, until every job has finished), the slots of one batch are
// disjoint, and the submitter does not touch a slot being read until then,
// so moving a job to another thread hands that thread exclusive use of its
// destination.
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

    /// Pieces the job is read in.
    fn pieces(&self) -> usize {
        self.len.div_ceil(PIECE_BYTES).max(1)
    }

    /// Reads piece `k` of the record; a file that ends first is
    /// `UnexpectedEof`.
    fn execute(&self, k: usize) -> io::Result<()> {
        let at = (k * PIECE_BYTES).min(self.len);
        let len = PIECE_BYTES.min(self.len - at);
        // SAFETY: see the `Send` impl: `dst .. dst + len` lies inside a live
        // slot buffer (the slot layout is checked against the buffer once,
        // when the slots are made) that no other job of the batch and no
        // reader touches until the batch completes; piece k is the part
        // `at .. at + len` of it, which no other piece covers.
        let buf = unsafe { std::slice::from_raw_parts_mut(self.dst.add(at), len) };
        let offset = self.offset + at as u64;
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
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
    /// Every piece of the batch: (job, piece of the job), job by job.
    pieces: Vec<(u32, u32)>,
    /// Whether each piece (same order) has been read.
    piece_read: Vec<bool>,
    /// Next piece to claim.
    next: usize,
    /// Pieces claimed or not whose read has not finished.
    unfinished: usize,
    /// The same, per job.
    job_unfinished: Vec<u32>,
    /// Per job: the index of its first piece in `pieces`, and how many of
    /// its pieces from the first on have all been read.
    job_first: Vec<u32>,
    job_prefix: Vec<u32>,
    /// The first failed job and its error.
    failure: Option<(usize, io::Error)>,
    /// When the last job of the batch finished.
    finished: Option<Instant>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Jobs were posted, or the pool is shutting down.
    wake: Condvar,
    /// A job of the batch finished (the last one, or any).
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a thread panicked; the state is still
        // consistent (every field is updated under the lock in one step).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims and runs pieces until none is left to claim.
    fn work<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        while st.next < st.pieces.len() {
            st = self.work_one(st);
        }
        st
    }

    /// Claims and runs the next piece (there must be one).
    fn work_one<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        let claimed = st.next;
        let (i, k) = st.pieces[claimed];
        let i = i as usize;
        st.next += 1;
        let job = st.jobs[i].duplicate();
        drop(st);
        let result = job.execute(k as usize);
        drop(job);
        st = self.lock();
        if let Err(e) = result {
            if st.failure.is_none() {
                st.failure = Some((i, e));
                self.done.notify_all();
            }
        }
        st.unfinished -= 1;
        st.job_unfinished[i] -= 1;
        st.piece_read[claimed] = true;
        let (first, n) = (st.job_first[i] as usize, st.jobs[i].pieces());
        let before = st.job_prefix[i];
        while (st.job_prefix[i] as usize) < n && st.piece_read[first + st.job_prefix[i] as usize] {
            st.job_prefix[i] += 1;
        }
        if st.unfinished == 0 {
            st.finished = Some(Instant::now());
        }
        if st.job_unfinished[i] == 0 || st.job_prefix[i] != before {
            self.done.notify_all();
        }
        st
    }
}

/// Reader threads that live as long as their session.
pub(crate) struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    capacity: usize,
    max_job_bytes: usize,
}

impl IoPool {
    /// A pool of `threads` reader threads besides the caller's, for batches
    /// of at most `max_jobs` reads of at most `max_job_bytes` each.
    pub(crate) fn new(threads: usize, max_jobs: usize, max_job_bytes: usize) -> io::Result<IoPool> {
        let piece_capacity = max_jobs.saturating_mul(max_job_bytes.div_ceil(PIECE_BYTES).max(1));
        // (No batch may outgrow these: `submit` rejects one that would.)
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: Vec::with_capacity(max_jobs),
                pieces: Vec::with_capacity(piece_capacity),
                piece_read: Vec::with_capacity(piece_capacity),
                next: 0,
                unfinished: 0,
                job_unfinished: Vec::with_capacity(max_jobs),
                job_first: Vec::with_capacity(max_jobs),
                job_prefix: Vec::with_capacity(max_jobs),
                failure: None,
                finished: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        let mut pool = IoPool {
            shared,
            threads: Vec::with_capacity(threads),
            capacity: max_jobs,
            max_job_bytes,
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
                        if st.next < st.pieces.len() {
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

    /// Posts one batch to the pool threads and returns without waiting.
    /// At most `max_jobs` jobs of at most `max_job_bytes` (see
    /// [`IoPool::new`]); more is an `InvalidInput` error before any read.
    /// One batch at a time: the returned [`Pending`] borrows the pool until
    /// it is waited for.
    pub(crate) fn submit(
        &self,
        jobs: impl ExactSizeIterator<Item = ReadJob>,
    ) -> Result<Pending<'_>, (usize, io::Error)> {
        if jobs.len() > self.capacity {
            return Err((0, io::ErrorKind::InvalidInput.into()));
        }
        let sh = &*self.shared;
        let mut st = sh.lock();
        st.jobs.clear();
        st.pieces.clear();
        st.jobs.extend(jobs);
        if let Some(i) = st.jobs.iter().position(|j| j.len > self.max_job_bytes) {
            st.jobs.clear();
            return Err((i, io::ErrorKind::InvalidInput.into()));
        }
        let State {
            jobs,
            pieces,
            piece_read,
            job_unfinished,
            job_first,
            job_prefix,
            ..
        } = &mut *st;
        job_unfinished.clear();
        job_first.clear();
        job_prefix.clear();
        for (i, job) in jobs.iter().enumerate() {
            job_first.push(pieces.len() as u32);
            job_prefix.push(0);
            pieces.extend((0..job.pieces()).map(|k| (i as u32, k as u32)));
            job_unfinished.push(job.pieces() as u32);
        }
        piece_read.clear();
        piece_read.resize(pieces.len(), false);
        st.next = 0;
        st.unfinished = st.pieces.len();
        st.failure = None;
        st.finished = None;
        if !st.pieces.is_empty() && !self.threads.is_empty() {
            sh.wake.notify_all();
        }
        Ok(Pending {
            pool: self,
            submitted: Instant::now(),
            waited: false,
            job_waits: std::cell::Cell::new(Duration::ZERO),
        })
    }

    /// Claims the batch's unclaimed jobs on this thread, then waits for the
    /// rest; returns the first failure, and when the last job finished.
    fn finish(&self) -> (Result<(), (usize, io::Error)>, Option<Instant>) {
        let sh = &*self.shared;
        let mut st = sh.work(sh.lock());
        while st.unfinished > 0 {
            st = sh.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.jobs.clear();
        st.pieces.clear();
        let finished = st.finished.take();
        match st.failure.take() {
            Some(f) => (Err(f), finished),
            None => (Ok(()), finished),
        }
    }
}

/// How long one batch took.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ReadTimes {
    /// From submission to the last read's end.
    pub busy: Duration,
    /// How long the caller was blocked in [`Pending::wait`] and
    /// [`Pending::wait_job`].
    pub waited: Duration,
}

/// A submitted batch. Its reads write into their slots until it is waited
/// for; dropping it unwaited (on an error path) waits too, so no read
/// outlives the borrow of the pool or the caller's buffers.
pub(crate) struct Pending<'p> {
    pool: &'p IoPool,
    submitted: Instant,
    waited: bool,
    /// Time the caller spent blocked in [`Pending::wait_job`].
    job_waits: std::cell::Cell<Duration>,
}

impl Pending<'_> {
    /// Returns when job `i` (in submission order) has been read, this
    /// thread reading unclaimed pieces meanwhile (pieces are claimed job by
    /// job, so jobs tend to finish in order): `true`, or `false` as soon as
    /// any read of the batch has failed ([`Pending::wait`] then says which
    /// and why). A job past the batch has nothing to wait for.
    pub(crate) fn wait_job(&self, i: usize) -> bool {
        self.wait_prefix(i, usize::MAX).is_some()
    }

    /// Returns when at least the first `bytes` of job `i` (all of it, when
    /// `bytes` is past its end) have been read, this thread reading
    /// unclaimed pieces meanwhile: how many of its first bytes have been
    /// read by then (whole pieces, so possibly more than `bytes`), or
    /// `None` as soon as any read of the batch has failed (as in
    /// [`Pending::wait_job`]). A job past the batch has nothing to wait
    /// for: `Some(0)`.
    pub(crate) fn wait_prefix(&self, i: usize, bytes: usize) -> Option<usize> {
        let start = Instant::now();
        let sh = &*self.pool.shared;
        let mut st = sh.lock();
        let read = |st: &State| {
            st.jobs.get(i).map_or(0, |job| {
                (st.job_prefix[i] as usize * PIECE_BYTES).min(job.len)
            })
        };
        let want = st.jobs.get(i).map_or(0, |job| bytes.min(job.len));
        while read(&st) < want && st.failure.is_none() {
            st = if st.next < st.pieces.len() {
                sh.work_one(st)
            } else {
                sh.done.wait(st).unwrap_or_else(|e| e.into_inner())
            };
        }
        let result = st.failure.is_none().then(|| read(&st));
        drop(st);
        self.job_waits.set(self.job_waits.get() + start.elapsed());
        result
    }

    /// Returns when every read of the batch has finished (this thread
    /// helps with unclaimed ones); on failure, the index (in submission
    /// order) of the first job that failed and its error.
    pub(crate) fn wait(mut self) -> Result<ReadTimes, (usize, io::Error)> {
        self.waited = true;
        let start = Instant::now();
        let (result, finished) = self.pool.finish();
        let end = Instant::now();
        result.map(|()| ReadTimes {
            busy: finished
                .unwrap_or(end)
                .saturating_duration_since(self.submitted),
            waited: end - start + self.job_waits.get(),
        })
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.waited {
            let _ = self.pool.finish();
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

    /// A temporary `ts-io-{tag}` file holding `data` (see
    /// [`crate::experts::file_holding`]).
    fn file_holding(tag: &str, data: &[u8]) -> (std::path::PathBuf, Arc<File>) {
        crate::experts::file_holding(&format!("io-{tag}"), data)
    }

    /// One batch, submitted and waited for.
    fn run(
        pool: &IoPool,
        jobs: impl ExactSizeIterator<Item = ReadJob>,
    ) -> Result<ReadTimes, (usize, io::Error)> {
        pool.submit(jobs)?.wait()
    }

    #[test]
    fn reads_in_parallel_and_reports_the_failing_job() {
        let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        let (path, file) = file_holding("pool", &data);
        let buf = AlignedBuf::zeroed(16 * 4096).unwrap();
        let pool = IoPool::new(3, 16, 4096).unwrap();
        for round in 0..4 {
            let jobs = (0..16).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: ((j + round) % 16) as u64 * 4096,
                dst: buf.region(j * 4096, 4096).unwrap(),
                len: 4096,
            });
            run(&pool, jobs).unwrap();
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
        let (i, e) = run(&pool, jobs).unwrap_err();
        assert_eq!(i, 1);
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let too_many = (0..17).map(|_| ReadJob {
            file: Arc::clone(&file),
            offset: 0,
            dst: buf.region(0, 1).unwrap(),
            len: 1,
        });
        assert!(run(&pool, too_many).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// Records longer than a piece are read piece by piece by every
    /// thread; a piece past the end of the file fails its job.
    #[test]
    fn long_records_are_read_in_pieces() {
        let len = 2 * PIECE_BYTES + 12_288;
        let data: Vec<u8> = (0..3 * len).map(|i| (i * 11 % 253) as u8).collect();
        let (path, file) = file_holding("pieces", &data);
        let buf = AlignedBuf::zeroed(3 * len).unwrap();
        for threads in [0, 1, 3] {
            let pool = IoPool::new(threads, 3, len).unwrap();
            let jobs = (0..3).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: ((2 - j) * len) as u64,
                dst: buf.region(j * len, len).unwrap(),
                len,
            });
            run(&pool, jobs).unwrap();
            for j in 0..3 {
                let at = (2 - j) * len;
                assert!(
                    buf.as_ref()[j * len..(j + 1) * len] == data[at..at + len],
                    "threads {threads}, job {j}"
                );
            }
            // Job 1's last piece runs past the end of the file.
            let jobs = (0..2).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: if j == 1 { (2 * len + 4096) as u64 } else { 0 },
                dst: buf.region(j * len, len).unwrap(),
                len,
            });
            let (i, e) = run(&pool, jobs).unwrap_err();
            assert_eq!(
                (i, e.kind()),
                (1, io::ErrorKind::UnexpectedEof),
                "threads {threads}"
            );
            // Longer jobs than the pool was made for are refused before any read.
            let long = std::iter::once(ReadJob {
                file: Arc::clone(&file),
                offset: 0,
                dst: buf.region(0, 3 * len).unwrap(),
                len: 3 * len,
            });
            assert!(run(&pool, long).is_err());
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// A job's first bytes can be waited for before its last are read:
    /// with no pool thread, the caller reads just the pieces asked for, in
    /// order; with threads, whatever prefix is reported has arrived.
    #[test]
    fn a_jobs_prefix_is_ready_before_its_end() {
        let len = 3 * PIECE_BYTES + 4096;
        let data: Vec<u8> = (0..2 * len).map(|i| (i * 13 % 251) as u8).collect();
        let (path, file) = file_holding("prefix", &data);
        for threads in [0, 3] {
            let buf = AlignedBuf::zeroed(2 * len).unwrap();
            let pool = IoPool::new(threads, 2, len).unwrap();
            let jobs = (0..2).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: (j * len) as u64,
                dst: buf.region(j * len, len).unwrap(),
                len,
            });
            let pending = pool.submit(jobs).unwrap();
            let got = pending.wait_prefix(1, PIECE_BYTES + 1).unwrap();
            assert!(
                (2 * PIECE_BYTES..=len).contains(&got),
                "threads {threads}: {got}"
            );
            assert!(
                buf.as_ref()[len..len + got] == data[len..len + got],
                "threads {threads}"
            );
            if threads == 0 {
                // Job 0's pieces were claimed first; job 1's last two not yet.
                assert_eq!(got, 2 * PIECE_BYTES);
                assert!(buf.as_ref()[len + got..].iter().all(|&b| b == 0));
            }
            assert_eq!(pending.wait_prefix(1, usize::MAX), Some(len));
            assert_eq!(pending.wait_prefix(2, 1), Some(0), "past the batch");
            pending.wait().unwrap();
            assert!(buf.as_ref()[..] == data[..]);
        }
        // A failed read ends the wait: no prefix.
        let pool = IoPool::new(0, 1, len).unwrap();
        let buf = AlignedBuf::zeroed(len).unwrap();
        let past_the_end = std::iter::once(ReadJob {
            file: Arc::clone(&file),
            offset: (len + 8192) as u64,
            dst: buf.region(0, len).unwrap(),
            len,
        });
        let pending = pool.submit(past_the_end).unwrap();
        assert_eq!(pending.wait_prefix(0, len), None);
        assert!(pending.wait().is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// Each job can be waited for on its own, in any order, before the
    /// batch; a failed read makes `wait_job` return false and `wait` name it.
    #[test]
    fn jobs_are_waited_for_one_by_one() {
        let len = PIECE_BYTES + 8192;
        let data: Vec<u8> = (0..4 * len).map(|i| (i * 17 % 239) as u8).collect();
        let (path, file) = file_holding("jobs", &data);
        for threads in [0, 1, 3] {
            let pool = IoPool::new(threads, 4, len).unwrap();
            let buf = AlignedBuf::zeroed(4 * len).unwrap();
            let jobs = (0..4).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: ((3 - j) * len) as u64,
                dst: buf.region(j * len, len).unwrap(),
                len,
            });
            let pending = pool.submit(jobs).unwrap();
            for j in [2, 0, 3, 1, 7] {
                assert!(pending.wait_job(j), "threads {threads}, job {j}");
                if j < 4 {
                    let at = (3 - j) * len;
                    assert!(
                        buf.as_ref()[j * len..(j + 1) * len] == data[at..at + len],
                        "threads {threads}, job {j} not read when waited for"
                    );
                }
            }
            pending.wait().unwrap();
            // Job 1 runs past the end of the file.
            let jobs = (0..2).map(|j| ReadJob {
                file: Arc::clone(&file),
                offset: if j == 1 { (3 * len + 4096) as u64 } else { 0 },
                dst: buf.region(j * len, len).unwrap(),
                len,
            });
            let pending = pool.submit(jobs).unwrap();
            let ok: Vec<bool> = (0..2).map(|j| pending.wait_job(j)).collect();
            assert!(!ok[1], "threads {threads}: the failed job reported as read");
            let (i, e) = pending.wait().unwrap_err();
            assert_eq!((i, e.kind()), (1, io::ErrorKind::UnexpectedEof));
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn submitted_reads_finish_by_wait_or_drop_with_or_without_threads() {
        let data: Vec<u8> = (0..32 * 1024).map(|i| (i * 13 % 241) as u8).collect();
        let (path, file) = file_holding("submit", &data);
        for threads in [0, 2] {
            let pool = IoPool::new(threads, 8, 4096).unwrap();
            for drop_unwaited in [false, true] {
                let buf = AlignedBuf::zeroed(8 * 4096).unwrap();
                let jobs = (0..8).map(|j| ReadJob {
                    file: Arc::clone(&file),
                    offset: (7 - j) as u64 * 4096,
                    dst: buf.region(j * 4096, 4096).unwrap(),
                    len: 4096,
                });
                let pending = pool.submit(jobs).unwrap();
                if drop_unwaited {
                    drop(pending);
                } else {
                    let t = pending.wait().unwrap();
                    assert!(t.waited <= t.busy + Duration::from_millis(50), "{t:?}");
                }
                for j in 0..8 {
                    let at = (7 - j) * 4096;
                    assert_eq!(
                        &buf.as_ref()[j * 4096..(j + 1) * 4096],
                        &data[at..at + 4096],
                        "threads {threads}, dropped {drop_unwaited}, slot {j}"
                    );
                }
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
}
