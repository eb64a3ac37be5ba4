//! `turbospark convert SRC DST`.

use crate::progress::{human_bytes, Progress};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use turbospark_format::convert::{convert, ConvertEvent, ConvertOptions};

#[derive(clap::Args)]
pub struct Args {
    /// A `.gguf` file or an HF checkpoint directory (config.json + *.safetensors).
    pub src: PathBuf,
    /// The install directory to create.
    pub dst: PathBuf,
    /// Replace DST if it exists (the old install is removed only after the
    /// new one is complete).
    #[arg(long)]
    pub force: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: Args) -> Result<ExitCode> {
    let start = Instant::now();
    let mut bar: Option<Progress> = None;
    let mut hash_bar: Option<Progress> = None;
    let manifest = convert(
        &a.src,
        &a.dst,
        ConvertOptions { force: a.force },
        &mut |ev| match ev {
            ConvertEvent::Planned { tensors, bytes } => {
                bar = Some(Progress::new("convert", tensors, bytes, a.quiet));
            }
            ConvertEvent::Tensor { done, bytes_done } => {
                if let Some(b) = bar.as_mut() {
                    b.update(done, bytes_done);
                }
            }
            ConvertEvent::Hashing { bytes_done, total } => {
                if let Some(b) = bar.as_mut() {
                    b.finish();
                }
                bar = None;
                hash_bar
                    .get_or_insert_with(|| Progress::new("sha256 ", 0, total, a.quiet))
                    .update(0, bytes_done);
            }
        },
    );
    if let Some(b) = hash_bar.as_mut() {
        b.finish();
    }
    if let Some(b) = bar.as_mut() {
        b.finish();
    }
    let manifest = manifest?;
    // Always said, quiet or not: the install holds less than the source.
    for s in &manifest.skipped {
        eprintln!(
            "skipped the {} ({} tensors, {}): not part of the language model",
            s.part,
            s.tensors,
            human_bytes(s.bytes)
        );
    }
    if !a.quiet {
        eprintln!(
            "wrote {} ({} {}, {} resident, {} in {} expert files) in {:.1}s",
            a.dst.display(),
            turbospark_format::families::name(&manifest.arch.family),
            manifest.source.kind,
            human_bytes(manifest.resident_bytes),
            human_bytes(manifest.expert_bytes()),
            manifest.experts.len(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}
