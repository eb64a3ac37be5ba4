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
//! An entry that opens with `~` (`~attention_decode`) hollows its
//! launches instead of leaving them out: each is replaced by a launch of
//! `hollow_step` (kernels/knockout.cu) with the same grid, block and
//! dynamic shared memory, which only waits for the kernel before it and
//! lets the next one in. So a step keeps the launch's place in the chain
//! (its dependent-launch boundary, its blocks' scheduling) and loses its
//! work: with the two settings side by side, a kernel's cost splits into
//! its place in the chain and its work. Where two entries pick a launch,
//! leaving it out wins over hollowing it.
//! The first skip of each kernel is reported on stderr, and once the
//! first such step is recorded, what each entry named and left out (or
//! hollowed) in it.

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream};
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One entry of the setting: a kernel name (a prefix, or exact with a
/// trailing `$`), with `%P=R` which of its launches (index mod P = R),
/// and whether the launches it picks are hollowed (a leading `~`) rather
/// than left out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    name: String,
    every: Option<(u64, u64)>,
    hollow: bool,
}

/// What becomes of one launch while a step is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Kept,
    Hollowed,
    LeftOut,
}

/// What [`knock`] says to do with a launch: run it, leave it out, or
/// launch this `hollow_step` in its place.
pub(crate) enum Knock {
    Run,
    Skip,
    Hollow(CudaFunction),
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
        .map(|entry| match entry.strip_prefix('~') {
            Some(rest) => (true, rest.trim()),
            None => (false, entry),
        })
        // (Empty entries, and a `~` naming nothing.)
        .filter(|(_, name)| !name.is_empty())
        .filter_map(|(hollow, entry)| match entry.split_once('%') {
            None => Some(Pattern {
                name: entry.to_owned(),
                every: None,
                hollow,
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
                    hollow,
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
        if self.hollow {
            f.write_str("~")?;
        }
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
    /// What becomes of the launch of kernel `name` in capture `capture`:
    /// left out (or hollowed) where some entry names it and, with `%P=R`,
    /// this is a launch it picks (every entry naming it counts it); left
    /// out where any entry that picks it leaves it out.
    fn fate(&mut self, patterns: &[Pattern], capture: u64, name: &str) -> Fate {
        if self.capture != capture || self.tallies.len() != patterns.len() {
            self.capture = capture;
            self.tallies = vec![Tally::default(); patterns.len()];
        }
        let mut fate = Fate::Kept;
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
            fate = match (picked, p.hollow, fate) {
                (false, _, f) => f,
                (true, false, _) => Fate::LeftOut,
                (true, true, Fate::LeftOut) => Fate::LeftOut,
                (true, true, _) => Fate::Hollowed,
            };
        }
        fate
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
                let done = if p.hollow { "hollowed" } else { "left out" };
                format!("{p}: {done} {} of the {} launches it names", t.left, t.seen)
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

/// Whether some entry of the setting hollows launches (so the device's
/// kernels must register their `hollow_step`: [`register_hollow`]).
pub(crate) fn hollows() -> bool {
    patterns().iter().any(|p| p.hollow)
}

/// Each context's `hollow_step` (by the driver's context handle), for the
/// launches a `~` entry hollows.
static HOLLOW: Mutex<Vec<(usize, CudaFunction)>> = Mutex::new(Vec::new());

/// Keeps `ctx`'s `hollow_step` for the launches on its streams that the
/// setting hollows.
pub(crate) fn register_hollow(ctx: &Arc<CudaContext>, f: CudaFunction) {
    if let Ok(mut all) = HOLLOW.lock() {
        let key = ctx.cu_ctx() as usize;
        all.retain(|(k, _)| *k != key);
        all.push((key, f));
    }
}

/// The `hollow_step` of `stream`'s context, if one was registered.
fn hollow_for(stream: &CudaStream) -> Option<CudaFunction> {
    let key = stream.context().cu_ctx() as usize;
    let all = HOLLOW.lock().ok()?;
    all.iter().find(|(k, _)| *k == key).map(|(_, f)| f.clone())
}

/// What to do with the launch of `f` on `stream`: run it, unless the
/// stream is recording a graph and the setting names it (then leave it
/// out, or launch a hollow step in its place).
pub(crate) fn knock(f: &CudaFunction, stream: &CudaStream) -> Knock {
    match fate(f, stream) {
        Fate::Kept => Knock::Run,
        Fate::LeftOut => Knock::Skip,
        Fate::Hollowed => match hollow_for(stream) {
            Some(h) => Knock::Hollow(h),
            None => {
                eprintln!("TURBOSPARK_CUDA_KNOCKOUT: no hollow_step for this GPU; launch kept");
                Knock::Run
            }
        },
    }
}

/// What becomes of the launch of `f` on `stream` (kept unless the stream
/// is recording a graph and the setting names it).
fn fate(f: &CudaFunction, stream: &CudaStream) -> Fate {
    let patterns = patterns();
    if patterns.is_empty() {
        return Fate::Kept;
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
        return Fate::Kept;
    }
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the function handle is alive (borrowed); on success the driver
    // points `name_ptr` at the function's NUL-terminated name, which lives
    // as long as its module.
    let ok = unsafe { sys::cuFuncGetName(&mut name_ptr, f.cu_function()) }
        == sys::CUresult::CUDA_SUCCESS;
    if !ok || name_ptr.is_null() {
        return Fate::Kept;
    }
    // SAFETY: checked non-null above; NUL-terminated by the driver.
    let name = unsafe { CStr::from_ptr(name_ptr) }.to_string_lossy();
    let Ok(mut counts) = COUNTS.lock() else {
        return Fate::Kept;
    };
    let fate = counts.fate(patterns, capture, &name);
    drop(counts);
    if fate == Fate::Kept {
        return Fate::Kept;
    }
    static REPORTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    if let Ok(mut seen) = REPORTED.lock() {
        if seen.insert(name.to_string()) {
            let done = match fate {
                Fate::Hollowed => "hollowed in",
                _ => "left out of",
            };
            eprintln!("TURBOSPARK_CUDA_KNOCKOUT: {name} {done} recorded steps (results are wrong)");
        }
    }
    fate
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
        let picked: Vec<bool> = (0..5)
            .map(|_| c.fate(&p, 7, product) == Fate::LeftOut)
            .collect();
        assert_eq!(picked, [false, true, false, true, false]);
        // Other kernels: by name alone, and uncounted by the period.
        assert_eq!(c.fate(&p, 7, "route"), Fate::LeftOut);
        assert_eq!(c.fate(&p, 7, "matmul1_q8x_q8_0_w4096"), Fate::Kept);
        assert_eq!(
            c.fate(&p, 7, product),
            Fate::LeftOut,
            "launch 5 of the recording"
        );
        assert_eq!(
            c.summary(&p),
            [
                "matmul1_q8x_q8_0_w2880$%2=1: left out 3 of the 6 launches it names",
                "route$: left out 1 of the 1 launches it names",
            ]
        );
        // A new recording counts afresh.
        assert_eq!(c.fate(&p, 8, product), Fate::Kept);
        assert_eq!(c.fate(&p, 8, product), Fate::LeftOut);
        assert_eq!(
            c.summary(&p)[0],
            "matmul1_q8x_q8_0_w2880$%2=1: left out 1 of the 2 launches it names"
        );
    }

    #[test]
    fn a_tilde_hollows_and_leaving_out_wins() {
        let p = parse("~attention_decode, ~ rms_norm%2=0, ~, rms_norm_vec$");
        assert_eq!(p.len(), 3, "a lone ~ names nothing and is dropped: {p:?}");
        assert!(p[0].hollow && p[1].hollow && !p[2].hollow);
        assert_eq!(p[1].name, "rms_norm");
        assert_eq!(p[1].to_string(), "~rms_norm%2=0");
        let mut c = Counts::default();
        assert_eq!(c.fate(&p, 1, "attention_decode_f16_64"), Fate::Hollowed);
        // rms_norm_vec's first launch: the hollowing entry's launch 0
        // (picked) and the exact entry's: left out wins. Its second: the
        // hollowing entry's launch 1 (not picked), the exact entry's.
        assert_eq!(c.fate(&p, 1, "rms_norm_vec"), Fate::LeftOut);
        assert_eq!(c.fate(&p, 1, "rms_norm_vec"), Fate::LeftOut);
        // rms_norm itself: the hollowing entry's launches 2 (picked) and 3.
        assert_eq!(c.fate(&p, 1, "rms_norm"), Fate::Hollowed);
        assert_eq!(c.fate(&p, 1, "rms_norm"), Fate::Kept);
        assert_eq!(c.fate(&p, 1, "route"), Fate::Kept);
        assert_eq!(
            c.summary(&p),
            [
                "~attention_decode: hollowed 1 of the 1 launches it names",
                "~rms_norm%2=0: hollowed 2 of the 4 launches it names",
                "rms_norm_vec$: left out 2 of the 2 launches it names",
            ]
        );
    }
}
