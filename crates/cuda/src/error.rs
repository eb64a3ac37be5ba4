//! Why the CUDA backend could not start.

use cudarc::driver::DriverError;

/// A failure to set up the CUDA backend. Errors of ops once it runs are
/// [`BackendError`](turbospark_backend::BackendError)s.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no NVIDIA driver: libcuda.so could not be loaded (install the NVIDIA driver, or run \
         with --backend cpu)"
    )]
    NoDriver,
    #[error(
        "NVRTC, CUDA's runtime compiler, could not be loaded (libnvrtc.so.13): install it (for \
         example `pip install nvidia-cuda-nvrtc==13.0.*` and add its nvidia/cu13/lib folder to \
         LD_LIBRARY_PATH), or run with --backend cpu"
    )]
    NoNvrtc,
    #[error("the CUDA backend computes in exact or fast numerics, not {0}")]
    Numerics(turbospark_backend::Numerics),
    #[error("CUDA device {ordinal} does not exist: the driver sees {count} device(s)")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA {what}: {source}")]
    Driver {
        what: &'static str,
        #[source]
        source: DriverError,
    },
    #[error(
        "the compiled CUDA kernels hold no kernel {name} (searched {modules} modules): the \
         kernel sources and their loader disagree"
    )]
    MissingKernel { name: String, modules: usize },
    #[error("compiling the CUDA kernels for {arch} failed:\n{log}")]
    Compile { arch: String, log: String },
}

impl CudaError {
    pub(crate) fn driver(what: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |source| CudaError::Driver { what, source }
    }
}

impl From<CudaError> for turbospark_backend::BackendError {
    fn from(e: CudaError) -> Self {
        turbospark_backend::BackendError::Device(e.to_string())
    }
}
