//! Helpers shared by the CLI integration tests.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Log-probability gap (nats) under which two tokens count as tied in
/// llama.cpp's own distribution.
pub const NEAR_TIE: f64 = 0.5;

/// tests/reference/llamacpp, the references of scripts/llamacpp/.
pub fn llamacpp_reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/reference/llamacpp")
}

/// A JSON array of token ids.
pub fn json_ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// llama.cpp's log-probability of `token` at a reference step, if in its
/// top list.
pub fn ref_logprob(step: &Value, token: u32) -> Option<f64> {
    step["top"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t[0].as_u64() == Some(u64::from(token)))
        .map(|t| t[1].as_f64().unwrap())
}

/// Gap between llama.cpp's best log-probability at `step` and `token`'s
/// (infinite when `token` is outside its top list).
pub fn ref_gap(step: &Value, token: u32) -> f64 {
    let best = step["top"][0][1].as_f64().unwrap();
    ref_logprob(step, token).map_or(f64::INFINITY, |lp| best - lp)
}

/// `${TURBOSPARK_CACHE:-~/.cache/turbospark}`, where scripts/fetch-models.sh
/// puts the models.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TURBOSPARK_CACHE") {
        Some(p) => PathBuf::from(p),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/turbospark")
        }
    }
}

/// Runs `turbospark convert -q SRC` into a fresh temporary directory named
/// after `tag`, asserting success; returns the install's path.
pub fn convert_to_temp(src: &Path, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("turbospark-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "convert",
            "-q",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tag}: convert of {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dst
}

/// Natural-log softmax of one row, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let lse = max
        + row
            .iter()
            .map(|&v| (f64::from(v) - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// A scratch directory under the system's temporary directory, named
/// `{name}-{pid}`, emptied when made and removed when dropped.
pub struct Work(pub PathBuf);

impl Work {
    pub fn new(name: &str) -> Work {
        let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Work(d)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
