//! The backend conformance suite on the GPU, in exact and fast numerics.
//! Skips with a message on machines without an NVIDIA driver, GPU or NVRTC.

use turbospark_backend::conformance::{
    check_all, check_delta_net, check_long_decode_attention, check_long_prefill_attention,
    Tolerances,
};
use turbospark_backend::Numerics;
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
    // A prefill chunk past the scalar kernels' shared memory (their long
    // form in exact numerics).
    if let Err(e) = check_long_prefill_attention(&dev, &tol) {
        panic!("{e}");
    }
    if let Err(e) = check_long_decode_attention(&dev, &tol) {
        panic!("{e}");
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
    // A prefill chunk past the scalar kernels' shared memory: on the
    // tensor cores, or (TURBOSPARK_CUDA_PREFILL_ATTN=scalar) their long form.
    if let Err(e) = check_long_prefill_attention(&dev, &tol) {
        panic!("{e}");
    }
    // One token over 40k keys: the tensor-core decode kernel, 64 splits
    // (or the split kernel under TURBOSPARK_CUDA_DECODE_ATTN=scalar).
    if let Err(e) = check_long_decode_attention(&dev, &tol) {
        panic!("{e}");
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
