//! The backend conformance suite on the GPU, in exact and fast numerics.
//! Skips with a message on machines without an NVIDIA driver, GPU or NVRTC.

use turbospark_backend::conformance::{
    check_all, check_delta_net, check_long_prefill_attention, ConformanceError, Tolerances,
};
use turbospark_backend::{BackendError, Numerics};
use turbospark_cuda::{CudaDevice, CudaError};

fn device(numerics: Numerics) -> Option<CudaDevice> {
    match CudaDevice::new(0, numerics) {
        Ok(d) => Some(d),
        Err(e @ (CudaError::NoDriver | CudaError::NoDevice { .. } | CudaError::NoNvrtc)) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("CUDA device setup failed: {e}"),
    }
}

#[test]
fn exact_numerics_conform() {
    let Some(dev) = device(Numerics::Exact) else {
        return;
    };
    eprintln!(
        "device: {} (sm_{}{})",
        dev.gpu_name(),
        dev.capability().0,
        dev.capability().1
    );
    let tol = Tolerances::for_numerics(Numerics::Exact);
    if let Err(e) = check_all(&dev, &tol).and_then(|()| check_delta_net(&dev, &tol)) {
        panic!("{e}");
    }
    // Exact numerics' attention keeps a score a key in shared memory: a
    // stream for more keys than that holds (~57k on an H100) is refused
    // with a clear error (fast numerics' tensor-core prefill kernel has no
    // bound; fast_numerics_conform holds it to the formula there).
    match check_long_prefill_attention(&dev, &tol) {
        Ok(()) => {}
        Err(ConformanceError::Backend {
            source: e @ BackendError::KeysPastKernel { .. },
            ..
        }) => eprintln!("exact numerics refuse a stream past 60k keys, as documented: {e}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn fast_numerics_conform() {
    let Some(dev) = device(Numerics::Fast) else {
        return;
    };
    let tol = Tolerances::for_numerics(Numerics::Fast);
    if let Err(e) = check_all(&dev, &tol).and_then(|()| check_delta_net(&dev, &tol)) {
        panic!("{e}");
    }
    // The tensor-core prefill attention takes any number of keys; the
    // scalar kernels it replaces (TURBOSPARK_CUDA_PREFILL_ATTN=scalar)
    // refuse past their shared memory, as in exact numerics.
    let scalar = std::env::var("TURBOSPARK_CUDA_PREFILL_ATTN").as_deref() == Ok("scalar");
    match check_long_prefill_attention(&dev, &tol) {
        Ok(()) => {}
        Err(ConformanceError::Backend {
            source: e @ BackendError::KeysPastKernel { .. },
            ..
        }) if scalar => eprintln!("the scalar prefill attention refuses 60k keys: {e}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn llama_cpp_numerics_are_refused() {
    match CudaDevice::new(0, Numerics::LlamaCpp) {
        Err(CudaError::Numerics(Numerics::LlamaCpp)) => {}
        Err(e) => panic!("expected a numerics error, got {e}"),
        Ok(_) => panic!("the CUDA backend accepted llama.cpp numerics"),
    }
}
