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
//! itself when it ends in `$` (`route$`). A step recorded with kernels left
//! out computes wrong values by design: their consumers read whatever the
//! skipped kernels last wrote (the prefill's, as only recorded steps skip:
//! routes stay valid expert slots, so every read stays in bounds), and the
//! logits mean nothing.
//! The first skip of each kernel is reported on stderr.

use cudarc::driver::{sys, CudaFunction, CudaStream};
use std::collections::BTreeSet;
use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

/// The setting's names, parsed once a process (none, with a message, on a
/// driver older than CUDA 12.3's, which cannot name a kernel:
/// `cuFuncGetName`).
fn patterns() -> &'static [String] {
    static PATTERNS: OnceLock<Vec<String>> = OnceLock::new();
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

/// The names of a setting: trimmed, empty entries dropped.
fn parse(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether kernel `name` matches one of `patterns`.
fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('$') {
        Some(exact) => name == exact,
        None => name.starts_with(p.as_str()),
    })
}

/// Whether the launch of `f` on `stream` is to be left out: the setting
/// names it and the stream is recording a graph.
pub(crate) fn skips(f: &CudaFunction, stream: &CudaStream) -> bool {
    let patterns = patterns();
    if patterns.is_empty() {
        return false;
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream handle is alive (borrowed) and `status` is a
    // valid place for the driver to write.
    let capturing = unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        == sys::CUresult::CUDA_SUCCESS
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
    if !matches(patterns, &name) {
        return false;
    }
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

    #[test]
    fn names_match_as_prefixes_or_exactly() {
        let p = parse(" rms_norm, route$ ,,attention_decode");
        assert_eq!(p, ["rms_norm", "route$", "attention_decode"]);
        assert!(matches(&p, "rms_norm_vec"));
        assert!(matches(&p, "route"));
        assert!(!matches(&p, "router1_q8x_q8_0"));
        assert!(matches(&p, "attention_decode_tc_f16_64"));
        assert!(!matches(&p, "attention_prefill_tc_f16_64"));
        assert!(!matches(&[], "route"));
    }
}
