//! The CPU backend against the backend conformance suite
//! (`turbospark_backend::conformance`), once per numerics mode and with
//! one and several threads: every op against the suite's f64 references,
//! within the tolerances of the mode.

use turbospark_backend::conformance::{self, ConformanceError, Tolerances};
use turbospark_backend::Numerics;
use turbospark_cpu::CpuDevice;

fn run(numerics: Numerics) -> Result<(), ConformanceError> {
    for threads in [1, 3] {
        let device = CpuDevice::new(threads)
            .expect("thread pool")
            .with_numerics(numerics);
        conformance::check_all(&device, &Tolerances::for_numerics(numerics))?;
    }
    Ok(())
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
