//! Helpers shared by the CLI integration tests that use cached real models.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

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
