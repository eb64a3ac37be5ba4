//! Every kernel compiles with NVRTC for sm_80 and sm_90 (no GPU needed;
//! skips with a message when NVRTC cannot be loaded).

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    for (major, minor) in [(8, 0), (9, 0)] {
        let ptx = match turbospark_cuda::nvrtc::compile(major, minor) {
            Ok(p) => p,
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        };
        eprintln!("sm_{major}{minor}: {} bytes of PTX", ptx.len());
    }
}

#[test]
fn a_kernel_that_fails_to_compile_is_a_clear_error() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    let src = "extern \"C\" __global__ void broken(float* x) { x[0] = not_declared; }".to_string();
    match turbospark_cuda::nvrtc::compile_source(src, 9, 0) {
        Err(e @ turbospark_cuda::CudaError::Compile { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("compute_90"), "{msg}");
            assert!(
                msg.contains("not_declared"),
                "NVRTC's log names the culprit: {msg}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
