//! Every kernel compiles with NVRTC to CUBIN for sm_80 and sm_90 (no GPU needed;
//! skips with a message when NVRTC cannot be loaded).

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    // Both targets at once (NVRTC compiles independent programs in
    // parallel; CI has two cores).
    let builds: Vec<_> = [(8, 0), (9, 0)]
        .into_iter()
        .map(|(major, minor)| {
            std::thread::spawn(move || {
                (major, minor, turbospark_cuda::nvrtc::compile(major, minor))
            })
        })
        .collect();
    for b in builds {
        let (major, minor, cubin) = b.join().expect("a compile thread");
        let cubin = match cubin {
            Ok(c) => c,
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        };
        // An ELF image (what the driver loads).
        assert_eq!(&cubin[..4], b"\x7fELF", "sm_{major}{minor}: not a CUBIN");
        eprintln!("sm_{major}{minor}: {} bytes of CUBIN", cubin.len());
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
            assert!(msg.contains("sm_90"), "{msg}");
            assert!(
                msg.contains("not_declared"),
                "NVRTC's log names the culprit: {msg}"
            );
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn the_stage_sync_experiment_compiles_for_sm80_and_sm90() {
    if !turbospark_cuda::nvrtc::nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc.so.13) not found; scripts/test.sh installs it");
        return;
    }
    // examples/stage_sync.rs compiles it, after common.cuh, on the GPU's
    // machine.
    let src = concat!(
        include_str!("../src/kernels/common.cuh"),
        include_str!("../examples/stage_sync.cu")
    );
    for (major, minor) in [(8, 0), (9, 0)] {
        match turbospark_cuda::nvrtc::compile_source(src.to_string(), major, minor) {
            Ok(cubin) => assert_eq!(&cubin[..4], b"\x7fELF", "sm_{major}{minor}: not a CUBIN"),
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        }
    }
}
