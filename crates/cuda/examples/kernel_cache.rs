//! Compiles the kernels for the given compute capabilities (default 9.0)
//! into the disk cache (`$TURBOSPARK_CACHE/cuda`), as a first start on such
//! a GPU would, so that a machine handed that directory skips NVRTC when
//! its NVRTC has the same version (`scripts/gpu/build.sh` fills
//! `.devcarry/cache` for the device machine this way). Needs NVRTC, no
//! GPU: `TURBOSPARK_CACHE=DIR cargo run --release -p turbospark-cuda
//! --example kernel_cache -- 90`.
//!
//! `--one` compiles every kernel as one program instead, without the
//! cache, and says how long that took: the way before the kernels were
//! split into programs compiled at once, for a same-machine comparison
//! (`scripts/gpu/run.sh compile`).

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let one = args.first().is_some_and(|a| a == "--one");
    if one {
        args.remove(0);
    }
    if args.is_empty() {
        args.push("90".into());
    }
    for cc in args {
        let Some((major, minor)) = turbospark_cuda::nvrtc::parse_capability(&cc) else {
            eprintln!("usage: kernel_cache [--one] [CC...]   (CC: two digits, e.g. 80 or 90)");
            std::process::exit(2);
        };
        let started = std::time::Instant::now();
        if one {
            let src = turbospark_cuda::nvrtc::source();
            match turbospark_cuda::nvrtc::compile_source(src, major, minor) {
                Ok(cubin) => println!(
                    "sm_{cc}: one program, {} bytes of CUBIN, compiled in {:.1} s (not cached)",
                    cubin.len(),
                    started.elapsed().as_secs_f64()
                ),
                Err(e) => {
                    eprintln!("error: sm_{cc}: {e}");
                    std::process::exit(1);
                }
            }
            continue;
        }
        let built = turbospark_cuda::nvrtc::compile_cached(major, minor, |programs| {
            eprintln!(
                "sm_{cc}: compiling {programs} programs on {} threads",
                turbospark_cuda::nvrtc::compile_threads(programs)
            )
        });
        match built {
            Ok(built) => println!(
                "sm_{cc}: {} programs, {} bytes of CUBIN; {} compiled now in {:.1} s, {} already cached",
                built.cubins.len(),
                built.cubins.iter().map(Vec::len).sum::<usize>(),
                built.compiled,
                started.elapsed().as_secs_f64(),
                built.cubins.len() - built.compiled
            ),
            Err(e) => {
                eprintln!("error: sm_{cc}: {e}");
                std::process::exit(1);
            }
        }
    }
}
