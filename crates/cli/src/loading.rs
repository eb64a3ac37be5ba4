//! Opening an install on the compute device, the one way every command
//! that runs a model (logits, run, chat, bench) does it. This is the only
//! place the CLI names a backend: [`Backend`] is the device type every
//! command's model lives on, and [`device`] builds it.

use anyhow::{Context, Result};
use std::path::Path;
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{ExpertOptions, Model};
use turbospark_format::install::Install;

/// The device the commands run models on.
pub type Backend = CpuDevice;

/// A device computing with `numerics` on `threads` threads, or one per
/// available core.
pub fn device(threads: Option<usize>, numerics: Numerics) -> Result<Backend> {
    let device = match threads {
        Some(t) => CpuDevice::new(t)?,
        None => CpuDevice::with_available_threads()?,
    };
    Ok(device.with_numerics(numerics))
}

/// Opens the install at `dir` with the given arithmetic and expert
/// residency; for MoE models prints the expert plan (mode, slots, why).
pub fn open_model(
    dir: &Path,
    threads: Option<usize>,
    numerics: Numerics,
    experts: &ExpertOptions,
) -> Result<Model<Backend>> {
    let install = Install::open(dir)?;
    let model = Model::open(&install, device(threads, numerics)?, experts)
        .with_context(|| format!("loading {}", dir.display()))?;
    if model.spec().moe.is_some() {
        eprintln!("{}", model.expert_store().plan());
    }
    Ok(model)
}
