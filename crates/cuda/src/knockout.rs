//! A measurement switch, never for use: `TURBOSPARK_CUDA_KNOCKOUT` leaves
//! the launches of the named kernels out of every recorded step (a decode
//! step captured into a CUDA graph), so that `bench`'s decode rate shows
//! what the step would take if those kernels cost nothing — where a
//! layer's time goes, measured in the replayed graph itself (dependent
//! launches overlapping), which Nsight Compute's one-kernel-at-a-time
//! durations cannot show.
//!
//! The setting is a comma-separated list of kernel names: a name matches
//! the kernels it begins (`rms_norm` matches `rms_norm_vec`), or only
//! itself when it ends in `$` (`route$`). A name may pick some of its
//! launches in each recorded step by their order: `NAME%P=R` leaves out
//! the launches it matches whose index among them (from 0, counted
//! afresh in each recording) leaves R when divided by P — one kernel
//! serving two products of a layer is told apart that way, e.g.
//! `matmul1_q8x_q8_0_w2880$%2=1` for the second of each layer's two
//! (gpt-oss: q/k/v, then the router). A step recorded with kernels left
//! out computes wrong values by design: their consumers read whatever the
//! skipped kernels last wrote (the prefill's, as only recorded steps skip:
//! routes stay valid expert slots, so every read stays in bounds), and the
//! logits mean nothing.
//! The first skip of each kernel is reported on stderr, and once the
//! first such step is recorded, what each entry named and left out in it.

use cudarc::driver::{sys, CudaFunction, CudaStream};
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// One entry of the setting: a kernel name (a prefix, or exact with a
/// trailing `$`) and, with `%P=R`, which of its launches (index mod P = R).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    name: String,
    every: Option<(u64, u64)>,
}

/// The setting's names, parsed once a process (none, with a message, on a
/// driver older than CUDA 12.3's, which cannot name a kernel:
/// `cuFuncGetName`).
fn patterns() -> &'static [Pattern] {
    static PATTERNS: OnceLock<Vec<Pattern>> = OnceLock::new();
    PATTERNS.get_or_init(|| {
        let names = std::env::var("TURBOSPARK_CUDA_KNOCKOUT")
            .map(|s| parse(&s))
            .unwrap_or_default();
        if names.is_empty() {
            return names;
        }
        let mut version = 0;
        // SAFETY: `version` is a valid place for the driver to write.
        let ok = unsafe { sys::cuDriverGetVersion(&mut version) } == sys::CUresult::CUDA_SUCCESS;
        if !ok || version < 12030 {
            eprintln!(
                "TURBOSPARK_CUDA_KNOCKOUT ignored: it needs a driver of CUDA 12.3 or later \
                 (this one reports {version})"
            );
            return Vec::new();
        }
        names
    })
}

/// The entries of a setting: trimmed, empty ones dropped. An entry whose
/// `%P=R` does not parse as integers with R < P is reported and dropped.
fn parse(setting: &str) -> Vec<Pattern> {
    setting
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|entry| match entry.split_once('%') {
            None => Some(Pattern {
                name: entry.to_owned(),
                every: None,
            }),
            Some((name, pick)) => {
                let every = pick
                    .split_once('=')
                    .and_then(|(p, r)| Some((p.trim().parse().ok()?, r.trim().parse().ok()?)))
                    .filter(|&(p, r): &(u64, u64)| r < p);
                if every.is_none() {
                    eprintln!(
                        "TURBOSPARK_CUDA_KNOCKOUT: {entry:?} ignored (expected NAME%P=R, R < P)"
                    );
                }
                Some(Pattern {
                    name: name.trim().to_owned(),
                    every: Some(every?),
                })
            }
        })
        .collect()
}

impl Pattern {
    /// Whether kernel `name` is one this entry names.
    fn names(&self, name: &str) -> bool {
        match self.name.strip_suffix('$') {
            Some(exact) => name == exact,
            None => name.starts_with(self.name.as_str()),
        }
    }
}

impl std::fmt::Display for Pattern {
    /// The entry as the setting spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        match self.every {
            Some((period, residue)) => write!(f, "%{period}={residue}"),
            None => Ok(()),
        }
    }
}

/// One entry's launches in a recording: those it names and those of them
/// it left out.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    seen: u64,
    left: u64,
}

/// Each entry's launches counted so far in one recording (`capture`, the
/// driver's id of the stream capture), in the setting's order.
#[derive(Debug, Default)]
struct Counts {
    capture: u64,
    tallies: Vec<Tally>,
}

impl Counts {
    /// Whether the launch of kernel `name` in capture `capture` is left
    /// out: some entry names it and, with `%P=R`, this is a launch it
    /// picks (every entry naming it counts it).
    fn skips(&mut self, patterns: &[Pattern], capture: u64, name: &str) -> bool {
        if self.capture != capture || self.tallies.len() != patterns.len() {
            self.capture = capture;
            self.tallies = vec![Tally::default(); patterns.len()];
        }
        let mut skip = false;
        for (p, t) in patterns.iter().zip(self.tallies.iter_mut()) {
            if !p.names(name) {
                continue;
            }
            let index = t.seen;
            t.seen += 1;
            let picked = p
                .every
                .is_none_or(|(period, residue)| index % period == residue);
            t.left += u64::from(picked);
            skip |= picked;
        }
        skip
    }

    /// A line for each entry: how many launches of the recording counted
    /// so far it named and how many it left out — so that a measurement
    /// says what its setting matched (e.g. whether the output head shares
    /// q/k/v's kernel).
    fn summary(&self, patterns: &[Pattern]) -> Vec<String> {
        patterns
            .iter()
            .zip(&self.tallies)
            .map(|(p, t)| {
                format!(
                    "{p}: left out {} of the {} launches it names",
                    t.left, t.seen
                )
            })
            .collect()
    }
}

static COUNTS: Mutex<Counts> = Mutex::new(Counts {
    capture: 0,
    tallies: Vec::new(),
});

/// Called once a step's recording has ended: under a knockout setting,
/// the first recording of the process reports, on stderr, what each entry
/// of the setting matched in it and left out.
pub(crate) fn step_recorded() {
    let patterns = patterns();
    if patterns.is_empty() {
        return;
    }
    static REPORTED: AtomicBool = AtomicBool::new(false);
    let Ok(counts) = COUNTS.lock() else {
        return;
    };
    if counts.tallies.len() != patterns.len() || REPORTED.swap(true, Ordering::Relaxed) {
        return;
    }
    for line in counts.summary(patterns) {
        eprintln!("TURBOSPARK_CUDA_KNOCKOUT: in the first recorded step, {line}");
    }
}

/// Whether the launch of `f` on `stream` is to be left out: the setting
/// names it and the stream is recording a graph.
pub(crate) fn skips(f: &CudaFunction, stream: &CudaStream) -> bool {
    let patterns = patterns();
    if patterns.is_empty() {
        return false;
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut capture: sys::cuuint64_t = 0;
    // SAFETY: the stream handle is alive (borrowed); `status` and
    // `capture` are valid places for the driver to write, and the other
    // outputs are optional (null: not asked for; CUDA 12.3's driver API,
    // which `patterns` requires).
    let capturing = unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut capture,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    } == sys::CUresult::CUDA_SUCCESS
        && status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if !capturing {
        return false;
    }
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the function handle is alive (borrowed); on success the driver
    // points `name_ptr` at the function's NUL-terminated name, which lives
    // as long as its module.
    let ok = unsafe { sys::cuFuncGetName(&mut name_ptr, f.cu_function()) }
        == sys::CUresult::CUDA_SUCCESS;
    if !ok || name_ptr.is_null() {
        return false;
    }
    // SAFETY: checked non-null above; NUL-terminated by the driver.
    let name = unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy();
    let Ok(mut counts) = COUNTS.lock() else {
        return false;
    };
    if !counts.skips(patterns, capture, &name) {
        return false;
    }
    drop(counts);
    static REPORTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    if let Ok(mut seen) = REPORTED.lock() {
        if seen.insert(name.to_string()) {
            eprintln!(
                "TURBOSPARK_CUDA_KNOCKOUT: {name} left out of recorded steps (results are wrong)"
            );
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether any entry of `p` names kernel `name`.
    fn named(p: &[Pattern], name: &str) -> bool {
        p.iter().any(|p| p.names(name))
    }

    #[test]
    fn names_match_as_prefixes_or_exactly() {
        let p = parse(" rms_norm, route$ ,,attention_decode");
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["rms_norm", "route$", "attention_decode"]);
        assert!(p.iter().all(|p| p.every.is_none()));
        assert!(named(&p, "rms_norm_vec"));
        assert!(named(&p, "route"));
        assert!(!named(&p, "router1_q8x_q8_0"));
        assert!(named(&p, "attention_decode_tc_f16_64"));
        assert!(!named(&p, "attention_prefill_tc_f16_64"));
        assert!(!named(&[], "route"));
    }

    #[test]
    fn a_period_picks_launches_by_their_order_in_each_recording() {
        let p = parse("matmul1_q8x_q8_0_w2880$%2=1, route$, bad%2=2, worse%x=1");
        assert_eq!(p.len(), 2, "the malformed entries are dropped: {p:?}");
        assert_eq!(p[0].every, Some((2, 1)));
        let mut c = Counts::default();
        // A layer's q/k/v then router product, twice, then the head (the
        // same kernel): only the routers (launches 1 and 3) are left out.
        let product = "matmul1_q8x_q8_0_w2880";
        let picked: Vec<bool> = (0..5).map(|_| c.skips(&p, 7, product)).collect();
        assert_eq!(picked, [false, true, false, true, false]);
        // Other kernels: by name alone, and uncounted by the period.
        assert!(c.skips(&p, 7, "route"));
        assert!(!c.skips(&p, 7, "matmul1_q8x_q8_0_w4096"));
        assert!(c.skips(&p, 7, product), "launch 5 of the recording");
        assert_eq!(
            c.summary(&p),
            [
                "matmul1_q8x_q8_0_w2880$%2=1: left out 3 of the 6 launches it names",
                "route$: left out 1 of the 1 launches it names",
            ]
        );
        // A new recording counts afresh.
        assert!(!c.skips(&p, 8, product));
        assert!(c.skips(&p, 8, product));
        assert_eq!(
            c.summary(&p)[0],
            "matmul1_q8x_q8_0_w2880$%2=1: left out 1 of the 2 launches it names"
        );
    }
}
