//! The kernels' CUDA C source and its compilation by NVRTC, cached on disk.
//!
//! The sources under `kernels/` are compiled at run time for the device's
//! compute capability, straight to its machine code (`sm_XY` CUBIN, which
//! the driver loads as it is), as several programs at once: every program
//! reads all the sources (they share definitions), and each emits the
//! kernels of some files only ([`PROGRAMS`]; common.cuh `KERNEL`). NVRTC
//! compiles one program on one thread, and ~99 % of its time goes to
//! optimising and assembling the kernels, so the programs compile in
//! about the time of the largest where there are enough cores; a kernel's
//! code is the same as in one program holding them all. Each program's
//! CUBIN is kept under `$TURBOSPARK_CACHE/cuda` (default
//! `~/.cache/turbospark/cuda`), keyed by a hash of its source, the target
//! and NVRTC's version, so a second start skips the compiler.

use crate::CudaError;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The kernel sources, in the order they are concatenated.
const SOURCES: [(&str, &str); 20] = [
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("matmul.cu", include_str!("kernels/matmul.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("layout.cu", include_str!("kernels/layout.cu")),
    ("headmm.cu", include_str!("kernels/headmm.cu")),
    ("deltanet.cu", include_str!("kernels/deltanet.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("attention_tc.cu", include_str!("kernels/attention_tc.cu")),
    ("attention_dec.cu", include_str!("kernels/attention_dec.cu")),
    ("route.cu", include_str!("kernels/route.cu")),
    ("moe.cu", include_str!("kernels/moe.cu")),
    ("q8dot.cu", include_str!("kernels/q8dot.cu")),
    ("q8one.cu", include_str!("kernels/q8one.cu")),
    ("q8cta.cu", include_str!("kernels/q8cta.cu")),
    ("mmq.cu", include_str!("kernels/mmq.cu")),
    ("tcmm.cu", include_str!("kernels/tcmm.cu")),
    ("tcmoe.cu", include_str!("kernels/tcmoe.cu")),
    ("q8mma.cu", include_str!("kernels/q8mma.cu")),
    ("kq.cu", include_str!("kernels/kq.cu")),
    ("knockout.cu", include_str!("kernels/knockout.cu")),
];

/// The programs the kernels are compiled as, each by the files whose
/// kernels it emits; every file with kernels is in exactly one (a test
/// checks). The largest first, and the small files grouped: compiled one
/// after another for sm_90 by NVRTC 13.0 on the development VM, these took
/// 17.1, 11.3, 7.9, 6.0, 4.5, 4.6, 5.0, 4.9 and 1.5 s (62.8 s together;
/// all kernels in one program took 66–71 s, of which the front end 0.5 s).
/// moe.cu's kernels bound the time on a machine of 4 or more cores.
pub const PROGRAMS: [&[&str]; 9] = [
    &["moe.cu"],
    &["tcmoe.cu"],
    &["kq.cu"],
    &["q8dot.cu"],
    &["tcmm.cu"],
    &["matmul.cu", "headmm.cu"],
    &["q8cta.cu", "deltanet.cu", "elementwise.cu"],
    &[
        "q8one.cu",
        "attention.cu",
        "attention_tc.cu",
        "attention_dec.cu",
        "mmq.cu",
    ],
    &["q8mma.cu", "route.cu", "layout.cu", "knockout.cu"],
];

/// Every source in one program that emits every kernel, with `#line`
/// markers so that compiler messages name the original file (for the PTX
/// of all kernels, [`compile_ptx`]).
pub fn source() -> String {
    program_text(|_| true)
}

/// The source of program `p` of [`PROGRAMS`]: every file, each kernel of
/// the files outside the program an uninstantiated template (common.cuh
/// `KERNEL`).
pub fn program_source(p: usize) -> String {
    program_text(|file| PROGRAMS[p].contains(&file))
}

fn program_text(emits: impl Fn(&str) -> bool) -> String {
    let mut s = String::new();
    for (name, text) in SOURCES {
        let kernel = if emits(name) {
            "extern \"C\" __global__"
        } else {
            "template <int> __global__"
        };
        s.push_str(&format!("#undef KERNEL\n#define KERNEL {kernel}\n"));
        s.push_str(&format!("#line 1 \"{name}\"\n"));
        s.push_str(text);
        s.push('\n');
    }
    s
}

/// Whether NVRTC can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the shared library by its known names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded (checked above); nvrtcVersion writes two ints.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Compile {
            arch: String::new(),
            log: format!("nvrtcVersion: {status:?}"),
        });
    }
    Ok((major, minor))
}

/// Machine code (CUBIN) of every program of [`PROGRAMS`] for
/// `sm_{major}{minor}`, compiled now, in that order.
pub fn compile(major: i32, minor: i32) -> Result<Vec<Vec<u8>>, CudaError> {
    let all: Vec<usize> = (0..PROGRAMS.len()).collect();
    compile_programs(&all, major, minor)
}

/// How many programs of `count` compile at once: one a core the machine
/// offers, at most one a program.
pub fn compile_threads(count: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(count).max(1)
}

/// Programs `which` (indices into [`PROGRAMS`]) compiled at once on
/// [`compile_threads`] threads, each taking the next program not yet
/// taken, in the order of `which` (the largest first); their CUBINs in
/// that order. A failure is the first failed program's.
fn compile_programs(which: &[usize], major: i32, minor: i32) -> Result<Vec<Vec<u8>>, CudaError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    type Slot = Mutex<Option<Result<Vec<u8>, CudaError>>>;
    let next = AtomicUsize::new(0);
    let done: Vec<Slot> = which.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..compile_threads(which.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&p) = which.get(i) else { break };
                let cubin = compile_source(program_source(p), major, minor);
                *done[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(cubin);
            });
        }
    });
    done.into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every program is taken by a thread before the scope ends")
        })
        .collect()
}

/// PTX of the kernels for `compute_{major}{minor}`, compiled now: for
/// static checks with CUDA's own tools (`examples/ptx.rs`).
pub fn compile_ptx(major: i32, minor: i32) -> Result<String, CudaError> {
    let mut ptx = nvrtc_compile(source(), format!("compute_{major}{minor}"), Output::Ptx)?;
    // NVRTC's PTX ends with a NUL.
    while ptx.last() == Some(&0) {
        ptx.pop();
    }
    Ok(String::from_utf8_lossy(&ptx).into_owned())
}

/// CUBIN of `src` for `sm_{major}{minor}` (so the driver loads it without
/// translating PTX); a failed compile is [`CudaError::Compile`] with
/// NVRTC's log.
pub fn compile_source(src: String, major: i32, minor: i32) -> Result<Vec<u8>, CudaError> {
    nvrtc_compile(src, format!("sm_{major}{minor}"), Output::Cubin)
}

/// What [`nvrtc_compile`] hands back.
enum Output {
    Ptx,
    Cubin,
}

/// `src` compiled by NVRTC for `arch` (`compute_XY` or `sm_XY`), its PTX or
/// CUBIN; a failed compile is [`CudaError::Compile`] with NVRTC's log.
fn nvrtc_compile(src: String, arch: String, output: Output) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let fail = |log: String| CudaError::Compile {
        arch: arch.clone(),
        log,
    };
    let text = std::ffi::CString::new(src)
        .map_err(|_| fail("the kernel source holds a NUL byte".into()))?;
    let prog = result::create_program(&text, None)
        .map_err(|e| fail(format!("nvrtcCreateProgram: {e}")))?;
    let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    // SAFETY: `prog` comes from create_program above, is used only here and
    // destroyed once, after its last use; `text` outlives it. The CUBIN
    // buffer has the size NVRTC reports for it.
    unsafe {
        let out = match result::compile_program(prog, &opts) {
            Err(e) => Err(fail(match result::get_program_log(prog) {
                Ok(log) => std::ffi::CStr::from_ptr(log.as_ptr())
                    .to_string_lossy()
                    .into_owned(),
                Err(_) => format!("nvrtcCompileProgram: {e}"),
            })),
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(prog)
                    .map(|ptx| ptx.into_iter().map(|c| c as u8).collect())
                    .map_err(|e| fail(format!("nvrtcGetPTX: {e}"))),
                Output::Cubin => {
                    let mut size = 0usize;
                    sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .and_then(|()| {
                            let mut cubin = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                                .result()
                                .map(|()| cubin)
                        })
                        .map_err(|e| fail(format!("nvrtcGetCUBIN: {e}")))
                }
            },
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// `(major, minor)` of a compute capability written as two digits ("90").
pub fn parse_capability(cc: &str) -> Option<(i32, i32)> {
    match cc.as_bytes() {
        [a @ b'0'..=b'9', b @ b'0'..=b'9'] => Some((i32::from(a - b'0'), i32::from(b - b'0'))),
        _ => None,
    }
}

/// The programs' CUBINs for `sm_{major}{minor}`, in [`PROGRAMS`] order,
/// each from the disk cache when it holds it, else compiled now (all
/// those at once, `compile_programs`) and stored; `before_compiling`
/// is told how many must be compiled before that starts (not called when
/// the cache holds them all). A machine that is handed a filled cache
/// directory (`TURBOSPARK_CACHE`, e.g. `scripts/gpu/build.sh`'s
/// `.devcarry/cache`, filled by `examples/kernel_cache.rs`) with the same
/// sources and NVRTC version skips the compiler.
pub fn compile_cached(
    major: i32,
    minor: i32,
    before_compiling: impl FnOnce(usize),
) -> Result<Cubins, CudaError> {
    let paths = (0..PROGRAMS.len())
        .map(|p| cache_path(major, minor, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cubins: Vec<Option<Vec<u8>>> = paths
        .iter()
        .map(|path| {
            let bytes = path.as_ref().and_then(|p| std::fs::read(p).ok());
            bytes.filter(|b| !b.is_empty())
        })
        .collect();
    let missing: Vec<usize> = (0..PROGRAMS.len())
        .filter(|&p| cubins[p].is_none())
        .collect();
    if !missing.is_empty() {
        before_compiling(missing.len());
        for (&p, cubin) in missing
            .iter()
            .zip(compile_programs(&missing, major, minor)?)
        {
            if let Some(path) = &paths[p] {
                // A cache that cannot be written only costs the next start
                // a compile.
                let _ = write_atomically(path, &cubin);
            }
            cubins[p] = Some(cubin);
        }
    }
    Ok(Cubins {
        cubins: cubins
            .into_iter()
            .map(|c| c.expect("every missing program was compiled above"))
            .collect(),
        compiled: missing.len(),
    })
}

/// What [`compile_cached`] hands back.
pub struct Cubins {
    /// Every program's CUBIN, in [`PROGRAMS`] order.
    pub cubins: Vec<Vec<u8>>,
    /// How many of them were compiled now (0: all came from the cache).
    pub compiled: usize,
}

/// Drops the cached CUBINs for `sm_{major}{minor}` (ones the driver would
/// not load), so that the next start compiles afresh.
pub fn forget_cached(major: i32, minor: i32) {
    for p in 0..PROGRAMS.len() {
        if let Ok(Some(path)) = cache_path(major, minor, p) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Where program `p`'s CUBIN for `sm_{major}{minor}` is cached: keyed by a
/// hash of its source, the target and NVRTC's version.
fn cache_path(major: i32, minor: i32, p: usize) -> Result<Option<PathBuf>, CudaError> {
    let (vmaj, vmin) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(program_source(p).as_bytes());
    h.update(format!("sm_{major}{minor} nvrtc {vmaj}.{vmin}").as_bytes());
    let key: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(cache_dir().map(|d| d.join(format!("kernels-sm{major}{minor}-p{p}-{key}.cubin"))))
}

/// The folder the CUBINs are cached in, if there is one (no
/// `TURBOSPARK_CACHE` and no `HOME`: none).
pub fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("TURBOSPARK_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/turbospark"),
    };
    Some(base.join("cuda"))
}

fn write_atomically(path: &std::path::Path, text: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::{program_source, PROGRAMS, SOURCES};

    /// Every file that defines kernels is in exactly one program, so each
    /// kernel is emitted once; every kernel opens with `KERNEL` (a
    /// definition that said `extern "C" __global__` itself would be
    /// emitted by every program).
    #[test]
    fn every_kernel_file_is_in_exactly_one_program() {
        for (file, text) in SOURCES {
            let programs = PROGRAMS.iter().filter(|p| p.contains(&file)).count();
            let has_kernels = text.contains("KERNEL void");
            assert_eq!(
                programs,
                usize::from(has_kernels),
                "{file}: in {programs} programs, {} kernels",
                if has_kernels { "with" } else { "without" }
            );
            if file != "common.cuh" {
                assert!(
                    !text.contains("__global__"),
                    "{file}: a kernel not opened by KERNEL"
                );
            }
        }
        for p in PROGRAMS.iter().flat_map(|p| p.iter()) {
            assert!(SOURCES.iter().any(|(f, _)| f == p), "{p} is not a source");
        }
        // Program 0 emits moe.cu's kernels and not kq.cu's.
        let src = program_source(0);
        let before = |file: &str| {
            let at = src.find(&format!("#line 1 \"{file}\"")).expect("the file");
            src[..at]
                .rsplit("#define KERNEL ")
                .next()
                .map(|d| d.lines().next().unwrap_or(""))
        };
        assert_eq!(before("moe.cu"), Some("extern \"C\" __global__"));
        assert_eq!(before("kq.cu"), Some("template <int> __global__"));
    }

    /// The integer a source's `#define NAME <integer>` gives NAME.
    fn defined(name: &str) -> Option<usize> {
        SOURCES.iter().find_map(|(_, text)| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix("#define ")?.strip_prefix(name)?;
                rest.starts_with(' ')
                    .then(|| rest.split_whitespace().next()?.parse().ok())?
            })
        })
    }

    /// The launch shapes kernels.rs gives the kernels are the ones their
    /// sources are written for.
    #[test]
    fn launch_constants_match_the_kernels_defines() {
        use crate::kernels::{self as k, q8, tc};
        let cases = [
            ("MM_WARPS", k::MM_WARPS),
            ("Q8_WARPS", k::Q8_THREADS as usize / 32),
            ("MQ_THREADS", k::MQ_THREADS as usize),
            ("ONE_WARPS", q8::ONE_WARPS),
            ("MMA_ROWS", k::MMA_ROWS),
            ("MMA_WARPS", k::MMA_THREADS as usize / 32),
            ("MMA_GU_WARPS", k::MMA_GU_THREADS as usize / 32),
            ("MMA_MAX_CHUNKS", k::MMA_MAX_COLS / 128),
            ("MMA_Q8_WARPS", k::MMA_Q8_WARPS),
            ("MMA_Q8_MAX_CPW", q8::MMA_Q8_MAX_CPW),
            ("TC_CHUNK", tc::TC_CHUNK),
            ("TC_SEG", tc::TC_SEG),
            ("TC_MAX_SEGS", tc::TC_MAX_SEGS),
            ("TC_ROW_WARPS", tc::TC_ROW_WARPS),
            ("TC_BATCH_WARPS", tc::TC_BATCH_THREADS as usize / 32),
            ("TC_BATCH_NT", tc::TC_BATCH_TOKENS / 8),
        ];
        for (name, value) in cases {
            assert_eq!(defined(name), Some(value), "#define {name}");
        }
        assert_eq!(k::MMA_GU_ROWS, 2 * k::MMA_ROWS, "MMA_GU_ROWS is two tiles");
        assert_eq!(q8::ONE_THREADS as usize, 32 * q8::ONE_WARPS);
        assert_eq!(tc::TC_BATCH_ROWS, 16 * tc::TC_BATCH_THREADS as usize / 32);
    }

    /// The text of the function `head` (e.g. `"void moe_down_q8_impl("`)
    /// opens in `text`: from there to its closing brace (the first
    /// unindented `}`), or to the end of `text`.
    fn function_text<'a>(text: &'a str, head: &str) -> Option<&'a str> {
        let at = text.find(head)?;
        Some(&text[at..text[at..].find("\n}\n").map_or(text.len(), |e| at + e)])
    }

    /// `s` without its whitespace.
    fn compact(s: &str) -> String {
        s.chars().filter(|c| !c.is_whitespace()).collect()
    }

    /// Whether `attention_decode_impl` in `text` waits (`kernel_entry`)
    /// before it first reads the queries (and before its first barrier).
    fn waits_before_reading_q(text: &str) -> bool {
        let Some(at) = text.find("void attention_decode_impl(") else {
            return false;
        };
        let body = &text[at..];
        let wait = body.find("kernel_entry();");
        let first_q = body.find("= q[");
        let first_barrier = body.find("__syncthreads();");
        matches!((wait, first_q, first_barrier), (Some(w), Some(q), Some(b)) if w < q && w < b)
    }

    /// Whether moe.cu's `route_slot<EARLY>`, the opening of the per-route
    /// kernels, waits before it reports a route not computed (its block
    /// then returns).
    fn route_slot_waits() -> bool {
        let moe = SOURCES
            .iter()
            .find(|(file, _)| *file == "moe.cu")
            .map(|(_, text)| *text);
        moe.and_then(|text| function_text(text, "bool route_slot("))
            .is_some_and(|body| {
                compact(body).contains(
                "if(slot_computed(only,slot,slots))returntrue;if(EARLY)KERNEL_ENTRY();returnfalse;",
            )
            })
    }

    /// Whether a per-route `body` (compacted) opens with `route_slot<early>`
    /// (which waits before a skipped route's return, [`route_slot_waits`])
    /// and has no other return.
    fn opens_with_route_slot(compact: &str, early: &str) -> bool {
        compact.contains(&format!(
            "u32slot;if(!route_slot<{early}>(routes,i,only,b.slots,slot))return;"
        )) && compact.matches("return;").count() == 1
    }

    /// Whether `moe_down_q8_impl` in `text` waits on both of its paths: the
    /// skipped route's return and the weights' first round
    /// (`q8_rows_dot1<…, true>`, which waits between the weight and the
    /// activation loads).
    fn down_waits_on_every_path(text: &str) -> bool {
        let Some(body) = function_text(text, "void moe_down_q8_impl(") else {
            return false;
        };
        let compact = compact(body);
        let dot_waits = text.contains("if (EARLY && s0 == 0) KERNEL_ENTRY();");
        opens_with_route_slot(&compact, "true")
            && route_slot_waits()
            && compact.contains("q8_rows_dot1<F,1,true>(")
            && dot_waits
    }

    /// Whether q8dot.cu's `moe_gate_up_q8_impl` in `text` waits on every
    /// path in its early form: the skipped route's return, and in
    /// `q8_rows_dot1<…, EARLY>` after the first round's weight loads.
    fn gate_up_waits_on_every_path(text: &str) -> bool {
        let Some(body) = function_text(text, "void moe_gate_up_q8_impl(") else {
            return false;
        };
        let compact = compact(body);
        let dot_waits = text.contains("if (EARLY && s0 == 0) KERNEL_ENTRY();");
        opens_with_route_slot(&compact, "EARLY")
            && route_slot_waits()
            && compact.contains("q8_rows_dot1<F,2,EARLY>(")
            && dot_waits
    }

    /// Whether q8mma.cu's `moe_down_mma_impl` in `text` waits on every
    /// path: the skipped route's return, and in `mma_rows_parts<true, …>`
    /// every warp (one with no chunk too) after its first round's weight
    /// loads and before it stages the token.
    fn mma_down_waits_on_every_path(text: &str) -> bool {
        let Some(body) = function_text(text, "void moe_down_mma_impl(") else {
            return false;
        };
        let compact = compact(body);
        opens_with_route_slot(&compact, "true")
            && route_slot_waits()
            && compact.contains("mma_rows_parts<true,")
            && matches!(
                (text.find("if (EARLY) KERNEL_ENTRY();"), text.find("mma_stage_token<THREADS>(s,")),
                (Some(w), Some(x)) if w < x
            )
    }

    /// Whether q8mma.cu's `matmul1_mma_q8_0_impl` in `text` issues only
    /// weight loads before it waits: no return, and the token staged
    /// after the wait.
    fn mma_q8_waits_before_the_token(text: &str) -> bool {
        let Some(body) = function_text(text, "void matmul1_mma_q8_0_impl(") else {
            return false;
        };
        matches!(
            (body.find("KERNEL_ENTRY();"), body.find("mma_stage_token<")),
            (Some(w), Some(x)) if w < x && !body[..w].contains("return")
        )
    }

    /// Whether kq.cu's `kq_rows_dot` in `text`, with EARLY, issues only
    /// weight loads before it waits: every lane waits after the first
    /// round's weight loads, with no return before, and reads the tokens
    /// after it (`kq_token_load<EARLY>`) through the loads kept after the
    /// wait.
    fn kq_waits_before_the_tokens(text: &str) -> bool {
        let Some(body) = function_text(text, "void kq_rows_dot(") else {
            return false;
        };
        let token = function_text(text, "KqToken kq_token_load(");
        matches!(
            (body.find("if (EARLY && s0 == 0) KERNEL_ENTRY();"), body.find("kq_token_load<EARLY>(")),
            (Some(w), Some(x)) if w < x && !body[..w].contains("return")
        ) && token.is_some_and(|t| {
            t.contains("EARLY ? ld_i4_after_wait(xl)")
                && t.contains("EARLY ? ld_i4_after_wait(xh)")
                && t.contains("EARLY ? ld_f32_after_wait(xd + b)")
        })
    }

    /// Whether kq.cu's per-route `imp` in `text` waits on every path: its
    /// one return (a skipped route's) waits first, and the products go through
    /// `kq_rows_dot<F, 1, rows, true>` (which waits after its first
    /// round's weight loads, [`kq_waits_before_the_tokens`]).
    fn kq_route_waits_on_every_path(text: &str, imp: &str, rows: usize) -> bool {
        let Some(body) = function_text(text, &format!("void {imp}(")) else {
            return false;
        };
        let compact = compact(body);
        opens_with_route_slot(&compact, "true")
            && route_slot_waits()
            && compact.contains(&format!("kq_rows_dot<F,1,{rows},true>("))
    }

    /// Whether tcmm.cu's `imp` in `text` issues only weight loads before it
    /// waits: no return, the tokens read after the wait; in
    /// `matmul_tc1_impl` also a warp with no chunk waits before the
    /// block's barrier (in `tc_tile_totals`); `matmul_tc_impl` waits first.
    fn tc_waits_before_the_tokens(text: &str, imp: &str) -> bool {
        let Some(body) = function_text(text, &format!("void {imp}(")) else {
            return false;
        };
        let body = &body[body.find('{').map_or(0, |b| b + 1)..];
        let waits_first = matches!(
            (body.find("KERNEL_ENTRY();"), body.find("tc_load_x8(")),
            (Some(w), Some(x)) if w < x && !body[..w].contains("return")
        );
        waits_first
            && match imp {
                "matmul_tc1_impl" => matches!(
                    (body.find("if (!waited) KERNEL_ENTRY();"), body.find("tc_tile_totals(")),
                    (Some(late), Some(sync)) if late < sync
                ),
                "matmul_tc_impl" => body.trim_start().starts_with("KERNEL_ENTRY();"),
                _ => true,
            }
    }

    /// Whether `imp` in `text` declares only its shared arrays before it
    /// waits (tcmoe.cu's kernels).
    fn waits_after_its_shared_arrays(text: &str, imp: &str) -> bool {
        let Some(at) = text.find(&format!("void {imp}(")) else {
            return false;
        };
        let body = &text[at..];
        let body = &body[body.find('{').map_or(0, |b| b + 1)..];
        let Some(wait) = body.find("KERNEL_ENTRY();") else {
            return false;
        };
        body[..wait].split(';').map(str::trim).all(|stmt| {
            stmt.is_empty() || stmt.starts_with("__shared__") || stmt.starts_with("constexpr")
        })
    }

    /// Kernels are launched as programmatic dependents of the kernel before
    /// them (kernels.rs `launch`), which is only sound when every kernel
    /// waits for its predecessor before anything else (common.cuh
    /// `KERNEL_ENTRY`): a kernel that read early, or returned before
    /// waiting, would break the chain of "the previous kernel finished".
    #[test]
    fn every_kernel_starts_by_waiting_for_the_one_before() {
        let mut kernels = 0;
        for (file, text) in SOURCES {
            let mut rest = text;
            while let Some(at) = rest.find("KERNEL void") {
                let after = &rest[at..];
                let open = after.find('{').expect("a kernel body");
                // (Past any `__launch_bounds__(…)`.)
                let head = &after[..open];
                let head = match head.find("__launch_bounds__(") {
                    Some(i) => &head[i + head[i..].find(')').map_or(0, |j| j + 1)..],
                    None => head,
                };
                let name: String = head
                    .split('(')
                    .next()
                    .and_then(|head| head.split_whitespace().last())
                    .unwrap_or("?")
                    .to_string();
                // The body's first statement, past blanks and macro line
                // continuations.
                let body =
                    after[open + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                // The exceptions (common.cuh) read only weights, which no
                // kernel writes, before waiting: one token's Q8_0 products
                // issue their first loads and then wait, every thread,
                // inside `one_token_units<…, true>` (q8one.cu, EARLY) or
                // `cta_token_units<…, true>` (q8cta.cu); the RMS norm loads
                // its weights, then waits (elementwise.cu); one token's
                // split attention fetches older cache rows into the L2,
                // then waits (attention.cu `attention_decode_impl`, which
                // calls `kernel_entry`); the rope with its cache writes
                // reads the position and forms its first rotation, then
                // waits before it reads a head or writes (elementwise.cu
                // `rope_kv`); the routed experts' per-route down products
                // read their route's slot and first weights, then wait
                // inside `q8_rows_dot1<…, true>`, or for a route not
                // computed before returning, in moe.cu's `route_slot`
                // (q8dot.cu `moe_down_q8_impl`, and `moe_gate_up_q8_impl`
                // in its early form; likewise q8mma.cu's
                // `moe_down_mma_impl` in `mma_rows_parts<true, …>`); the
                // tensor-core products of a few tokens issue their first
                // weight loads, then wait, every warp (also one with no
                // chunk), before reading a token (tcmm.cu
                // `matmul_tc1_impl`, `matmul_tc1r_impl`, `matmul_tc1s_impl`,
                // whose loads are copies into shared memory, also under
                // `router_tc1s_bf16`'s routing; tcmoe.cu's expert
                // kernels declare their shared arrays, then wait); one
                // token's Q8_0 products on the
                // tensor cores issue all their weight loads, then wait,
                // then stage the token (q8mma.cu `matmul1_mma_q8_0_impl`).
                let tc_early = [
                    ("matmul_tc1_", "matmul_tc1_impl"),
                    ("matmul_tc1r_", "matmul_tc1r_impl"),
                    ("matmul_tc1s_", "matmul_tc1s_impl"),
                    ("router_tc1s_", "matmul_tc1s_impl"),
                    ("matmul_tc_", "matmul_tc_impl"),
                ]
                .iter()
                .any(|&(kernel, imp)| {
                    name.starts_with(kernel)
                        && body.starts_with(&format!("{imp}<"))
                        && tc_waits_before_the_tokens(text, imp)
                });
                let attention_early = name.starts_with("attention_decode_")
                    && body.starts_with("attention_decode_impl<")
                    && waits_before_reading_q(text);
                let down_early = (name.starts_with("moe_down_q8x_")
                    && body.starts_with("moe_down_q8_impl<")
                    && down_waits_on_every_path(text))
                    || (name.starts_with("moe_gate_up_early_q8x_")
                        && body.starts_with("moe_gate_up_q8_impl<F, W, true>(")
                        && gate_up_waits_on_every_path(text))
                    || (name.starts_with("moe_down_mma_")
                        && body.starts_with("moe_down_mma_impl<")
                        && mma_down_waits_on_every_path(text));
                let tc_moe = [
                    ("moe_gate_up_tc1_", "moe_tc1_impl"),
                    ("moe_down_tc1_", "moe_tc1_impl"),
                    ("moe_gate_up_tc_", "moe_tc_grouped_impl"),
                    ("moe_down_tc_", "moe_tc_grouped_impl"),
                ]
                .iter()
                .any(|&(kernel, imp)| {
                    name.starts_with(kernel)
                        && body.starts_with(&format!("{imp}<"))
                        && waits_after_its_shared_arrays(text, imp)
                });
                let q8_mma_early = name.starts_with("matmul1_mma_q8_0_c")
                    && body.starts_with("matmul1_mma_q8_0_impl<")
                    && mma_q8_waits_before_the_token(text);
                let kq_early = ((name.starts_with("kq_matmul1_")
                    && body.starts_with("kq_matmul_impl<F, 1, true>("))
                    || (name.starts_with("kq_gate_up1_")
                        && body.starts_with("kq_gate_up1_impl<F>(")
                        && kq_route_waits_on_every_path(text, "kq_gate_up1_impl", 2))
                    || (name.starts_with("kq_down1_")
                        && body.starts_with("kq_down1_impl<F>(")
                        && kq_route_waits_on_every_path(text, "kq_down1_impl", 1)))
                    && kq_waits_before_the_tokens(text);
                let rope_early = name == "rope_kv"
                    && matches!(
                        (body.find("KERNEL_ENTRY();"), body.find("head[a]"), body.find("cache_store(")),
                        (Some(w), Some(x), Some(c)) if w < x && w < c
                    );
                let early = name.starts_with("matmul1_q8x_")
                    || name.starts_with("matmul1c_q8x_")
                    || name == "router1_q8x_q8_0"
                    || name == "router1c_q8x_q8_0";
                // (The template argument EARLY: the third of
                // one_token_units, the second of cta_token_units.)
                let waits_early = [("one_token_units<", 2), ("cta_token_units<", 1)]
                    .iter()
                    .any(|&(units, early_at)| {
                        body.split(units)
                            .nth(1)
                            .and_then(|args| args.split('>').next())
                            .and_then(|args| args.split(',').nth(early_at))
                            .is_some_and(|early| early.trim() == "true")
                    });
                let compact = compact(body);
                let norm_early = (name == "rms_norm"
                    && compact.starts_with(
                        "floatwv[NORM_PER];norm_weights(w,dim,mode,wv);KERNEL_ENTRY();",
                    ))
                    || (name == "rms_norm_vec"
                        && compact.starts_with(
                            "floatwv[NORM_VEC];norm_vec_weights(w,dim,mode,wv);KERNEL_ENTRY();",
                        ));
                assert!(
                    body.starts_with("KERNEL_ENTRY();")
                        || (early && waits_early)
                        || norm_early
                        || attention_early
                        || down_early
                        || rope_early
                        || q8_mma_early
                        || kq_early
                        || tc_early
                        || tc_moe,
                    "{file}: kernel {name} does not start with KERNEL_ENTRY(): {:?}",
                    &body[..body.len().min(60)]
                );
                kernels += 1;
                rest = &after[open..];
            }
        }
        assert!(kernels >= 40, "found only {kernels} kernels");
    }
}
