//! The CPU backend against the backend conformance suite
//! (`turbospark_backend::conformance`), once per numerics mode and with
//! one and several threads: every op against the suite's f64 references,
//! within the tolerances of the mode; fast numerics also on the portable
//! kernels, whatever the CPU has.

use turbospark_backend::conformance::{self, ConformanceError, Tolerances};
use turbospark_backend::Numerics;
use turbospark_cpu::{CpuDevice, Isa};

fn run_on(numerics: Numerics, isa: Isa) -> Result<(), ConformanceError> {
    for threads in [1, 3] {
        let device = CpuDevice::new(threads)
            .expect("thread pool")
            .with_numerics(numerics)
            .with_isa(isa);
        let tol = Tolerances::for_numerics(numerics);
        conformance::check_all(&device, &tol)?;
        conformance::check_delta_net(&device, &tol)?;
        conformance::check_long_prefill_attention(&device, &tol)?;
        conformance::check_long_decode_attention(&device, &tol)?;
    }
    Ok(())
}

fn run(numerics: Numerics) -> Result<(), ConformanceError> {
    run_on(numerics, Isa::detect())
}

#[test]
fn exact_numerics_conform() {
    if let Err(e) = run(Numerics::Exact) {
        panic!("exact: {e}");
    }
}

#[test]
fn llama_cpp_numerics_conform() {
    if let Err(e) = run(Numerics::LlamaCpp) {
        panic!("llama-cpp: {e}");
    }
}

#[test]
fn fast_numerics_conform() {
    if let Err(e) = run(Numerics::Fast) {
        panic!("fast: {e}");
    }
}

#[test]
fn fast_numerics_conform_on_portable_kernels() {
    if let Err(e) = run_on(Numerics::Fast, Isa::Scalar) {
        panic!("fast, scalar kernels: {e}");
    }
}
