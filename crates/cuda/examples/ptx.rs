//! Prints the kernels' PTX for one compute capability (default 9.0), as
//! NVRTC compiles it at run time, for static checks with CUDA's own tools
//! where no GPU is at hand, e.g. registers, spills and stack of every
//! kernel: `cargo run --release -p turbospark-cuda --example ptx -- 90 >
//! k.ptx && ptxas -arch=sm_90 -v k.ptx -o /dev/null` (`ptxas` comes with
//! `pip install nvidia-cuda-nvcc==13.0.*`, under `nvidia/cu13/bin`).
//! Needs NVRTC (see the README).

fn main() {
    let cc = std::env::args().nth(1).unwrap_or_else(|| "90".into());
    let Some((major, minor)) = turbospark_cuda::nvrtc::parse_capability(&cc) else {
        eprintln!("usage: ptx [CC]   (CC: two digits, e.g. 80 or 90; default 90)");
        std::process::exit(2);
    };
    match turbospark_cuda::nvrtc::compile_ptx(major, minor) {
        Ok(ptx) => print!("{ptx}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
