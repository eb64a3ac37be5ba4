//! Opening an install on the CPU backend, the one way every command that
//! runs a model (logits, run, chat, bench) does it.

use anyhow::{Context, Result};
use std::path::Path;
use turbospark_cpu::{CpuBackend, Numerics};
use turbospark_engine::{ExpertOptions, Model};
use turbospark_format::install::Install;

/// A CPU backend with `threads` threads, or one per available core.
pub fn cpu_backend(threads: Option<usize>) -> Result<CpuBackend> {
    Ok(match threads {
        Some(t) => CpuBackend::new(t)?,
        None => CpuBackend::with_available_threads()?,
    })
}

/// Opens the install at `dir` with the given arithmetic and expert
/// residency; for MoE models prints the expert plan (mode, slots, why).
pub fn open_model(
    dir: &Path,
    threads: Option<usize>,
    numerics: Numerics,
    experts: &ExpertOptions,
) -> Result<Model<CpuBackend>> {
    let install = Install::open(dir)?;
    let backend = cpu_backend(threads)?.with_numerics(numerics);
    let model = Model::open(&install, backend, experts)
        .with_context(|| format!("loading {}", dir.display()))?;
    if model.spec().moe.is_some() {
        eprintln!("{}", model.expert_store().plan());
    }
    Ok(model)
}
