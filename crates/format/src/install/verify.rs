//! `verify`: re-hash every file of an install against its manifest.

use super::manifest::*;
use super::reader::read_manifest;
use super::writer::hash_file;
use crate::error::FormatError;
use std::path::Path;

/// The outcome for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileStatus {
    Ok,
    Missing,
    SizeMismatch { expected: u64, found: u64 },
    HashMismatch { expected: String, found: String },
}

#[derive(Debug, Clone)]
pub struct VerifyReport {
    pub files: Vec<(FileEntry, FileStatus)>,
}

impl VerifyReport {
    pub fn all_ok(&self) -> bool {
        self.files.iter().all(|(_, s)| *s == FileStatus::Ok)
    }
    pub fn failures(&self) -> impl Iterator<Item = &(FileEntry, FileStatus)> {
        self.files.iter().filter(|(_, s)| *s != FileStatus::Ok)
    }
}

/// Re-hashes every file the manifest lists. `progress(file, bytes_done)`.
pub fn verify_install(
    dir: &Path,
    progress: &mut dyn FnMut(&str, u64),
) -> Result<VerifyReport, FormatError> {
    let manifest = read_manifest(dir)?;
    let mut files = Vec::new();
    let mut done = 0u64;
    for entry in &manifest.files {
        let path = dir.join(&entry.path);
        let status = match std::fs::metadata(&path) {
            Err(_) => FileStatus::Missing,
            Ok(m) if m.len() != entry.bytes => FileStatus::SizeMismatch {
                expected: entry.bytes,
                found: m.len(),
            },
            Ok(_) => {
                let (_, sha) = hash_file(&path, &mut |n| {
                    done += n;
                    progress(&entry.path, done)
                })?;
                if sha == entry.sha256 {
                    FileStatus::Ok
                } else {
                    FileStatus::HashMismatch {
                        expected: entry.sha256.clone(),
                        found: sha,
                    }
                }
            }
        };
        files.push((entry.clone(), status));
    }
    Ok(VerifyReport { files })
}
