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
