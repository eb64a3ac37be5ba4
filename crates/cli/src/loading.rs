//! Opening an install on a compute device, the one way every command that
//! runs a model (logits, run, chat, bench) does it, and the one place the
//! CLI names backends: `--backend cpu|cuda` ([`DeviceArgs`]) picks the
//! device, and a command's model work is a [`ModelTask`], generic over the
//! device, that [`with_model`] runs on whichever was picked.

use anyhow::{Context, Result};
use std::path::Path;
use turbospark_backend::Device;
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{ExpertOptions, Model};
use turbospark_format::install::Install;

/// `--backend` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// x86-64 CPU (AVX2 kernels where the processor has them).
    Cpu,
    /// An NVIDIA GPU (needs the NVIDIA driver and NVRTC 13).
    Cuda,
}

/// Which device runs the model.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// The compute device: `cpu` or `cuda` (an NVIDIA GPU; kernels are
    /// compiled at first use by NVRTC and cached under
    /// ~/.cache/turbospark/cuda).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendArg,
    /// Which GPU `--backend cuda` uses (0 is the first).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub gpu: usize,
}

/// A command's work on a loaded model, whatever device it lives on.
pub trait ModelTask {
    type Output;
    fn run<D: Device>(self, model: Model<D>) -> Result<Self::Output>;
}

/// A CPU device computing with `numerics` on `threads` threads, or one per
/// available core.
pub fn cpu_device(threads: Option<usize>, numerics: Numerics) -> Result<CpuDevice> {
    let device = match threads {
        Some(t) => CpuDevice::new(t)?,
        None => CpuDevice::with_available_threads()?,
    };
    Ok(device.with_numerics(numerics))
}

/// GPU `ordinal` computing with `numerics`.
#[cfg(feature = "cuda")]
pub fn cuda_device(ordinal: usize, numerics: Numerics) -> Result<turbospark_cuda::CudaDevice> {
    Ok(turbospark_cuda::CudaDevice::new(ordinal, numerics)?)
}

/// Opens the install at `dir` on `device` with the given expert residency;
/// for MoE models prints the expert plan (mode, slots, why).
pub fn open_model<D: Device>(dir: &Path, device: D, experts: &ExpertOptions) -> Result<Model<D>> {
    let install = Install::open(dir)?;
    let model = Model::open(&install, device, experts)
        .with_context(|| format!("loading {}", dir.display()))?;
    if model.spec().moe.is_some() {
        eprintln!("{}", model.expert_store().plan());
    }
    Ok(model)
}

/// Opens the install at `dir` on the device `device` names and runs `task`
/// on it.
pub fn with_model<T: ModelTask>(
    dir: &Path,
    device: &DeviceArgs,
    threads: Option<usize>,
    numerics: Numerics,
    experts: &ExpertOptions,
    task: T,
) -> Result<T::Output> {
    match device.backend {
        BackendArg::Cpu => task.run(open_model(dir, cpu_device(threads, numerics)?, experts)?),
        BackendArg::Cuda => {
            #[cfg(feature = "cuda")]
            {
                let gpu = cuda_device(device.gpu, numerics)?;
                task.run(open_model(dir, gpu, experts)?)
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = (dir, experts, task);
                anyhow::bail!(
                    "this turbospark was built without the `cuda` feature; rebuild with it or use --backend cpu"
                )
            }
        }
    }
}
