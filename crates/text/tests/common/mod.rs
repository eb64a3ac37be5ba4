//! Locating the cached models and llama.cpp sources for tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `${TURBOSPARK_CACHE:-~/.cache/turbospark}`.
pub fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("TURBOSPARK_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/turbospark")
}

/// Whether a missing artefact fails the test instead of skipping it.
pub fn required() -> bool {
    std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_some()
}

/// Returns the path if it exists; otherwise skips (prints why) or, with
/// `TURBOSPARK_REQUIRE_MODELS` set, fails.
pub fn locate(path: PathBuf, how_to_get: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let msg = format!("{} is missing ({how_to_get})", path.display());
    if required() {
        panic!("{msg}; TURBOSPARK_REQUIRE_MODELS is set");
    }
    eprintln!("skipped: {msg}");
    None
}

/// `vendor/llama.cpp/models` of the llama-cpp-python sdist.
pub fn llama_cpp_models() -> Option<PathBuf> {
    locate(
        cache_dir().join("llama-cpp-python/vendor/llama.cpp/models"),
        "run scripts/fetch-models.sh llamacpp",
    )
}

pub fn real_model(file: &str) -> Option<PathBuf> {
    locate(
        cache_dir().join("models").join(file),
        "run scripts/fetch-models.sh",
    )
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
