//! `turbospark verify DIR`.

use crate::progress::Progress;
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use turbospark_format::install::verify::FileStatus;
use turbospark_format::install::verify_install;

#[derive(clap::Args)]
pub struct Args {
    /// The install directory.
    pub dir: PathBuf,
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let manifest = turbospark_format::install::reader::read_manifest(&a.dir)?;
    let total: u64 = manifest.files.iter().map(|f| f.bytes).sum();
    let mut bar = Progress::new("verify", 0, total, a.quiet);
    let report = verify_install(&a.dir, &mut |_, done| bar.update(0, done))?;
    bar.finish();
    for (entry, status) in report.failures() {
        let why = match status {
            FileStatus::Ok => continue,
            FileStatus::Missing => "missing".to_string(),
            FileStatus::SizeMismatch { expected, found } => {
                format!("size {found} bytes, manifest says {expected}")
            }
            FileStatus::HashMismatch { expected, found } => {
                format!("sha256 {found}, manifest says {expected}")
            }
        };
        eprintln!("MISMATCH {}: {why}", entry.path);
    }
    if report.all_ok() {
        if !a.quiet {
            println!("ok: {} files verified", report.files.len());
        }
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "FAILED: {} of {} files do not match the manifest",
            report.failures().count(),
            report.files.len()
        );
        Ok(ExitCode::from(1))
    }
}
