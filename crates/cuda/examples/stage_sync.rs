//! What a step boundary of a decode chain costs, launched one kernel a
//! step (programmatic dependent launches in a CUDA graph, as the engine's
//! decode step runs) against one persistent kernel whose blocks meet at a
//! grid-wide barrier between steps, with and without each warp issuing its
//! next step's weight loads before the barrier — the question a decode
//! "megakernel" rests on (BENCHMARKS.md, twenty-ninth session) — and, on
//! sm_90, with the weights brought into a ring of shared-memory slots by
//! the SM's bulk copy engine, a producer thread running ahead across steps
//! (persistent: with the barrier, without it, with an unordered one, with
//! the outputs written by bulk copy and no fence, the copies alone; and
//! one launch a step; thirty-fifth session).
//!
//! Each run is a chain of `STEPS` matrix-vector products of one token, each
//! over its own matrix (together past the L2, so every step reads HBM),
//! rows × 2880 8-bit codes with a scale a 32-code block (the kernels of
//! `stage_sync.cu`, a simplified Q8_0 product, the same in every variant).
//! Each chain runs again with a small step after every product (one block
//! sums its outputs: a decode layer's norms and routing sit between its
//! products like that). Printed: µs a step (a product, or a product and
//! its small step) and GB/s of weight bytes, per variant, for
//! q/k/v-sized (5120 rows), expert-down-sized (2880) and small (512)
//! steps; then the floors — an empty dependent launch and a bare barrier.
//! Every variant's outputs are checked against a host reference before
//! its time is printed. Prints "skipped" without a GPU.
//!
//! `cargo run --release -p turbospark-cuda --example stage_sync [REPLAYS
//! [STEPS]]` (`scripts/gpu/run.sh stagesync` on the device; STEPS a chain,
//! default 24, the 24 matrices taken in turn).

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaContext, CudaFunction};

/// The experiment's kernels after the engine's shared helpers
/// (`KERNEL_ENTRY`, the weight-stream loads).
const SOURCE: &str = concat!(
    include_str!("../src/kernels/common.cuh"),
    include_str!("stage_sync.cu")
);
/// Columns of every row (stage_sync.cu COLS).
const COLS: usize = 2880;
/// Warps a block (stage_sync.cu WARPS).
const WARPS: usize = 4;
/// Steps a chain.
const STEPS: usize = 24;
/// Rows a step, per run.
const ROWS: [usize; 3] = [5120, 2880, 512];

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let replays: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 50,
    };
    // Steps a chain: the STEPS matrices taken in turn (more steps a launch
    // spread the persistent kernels' launch over more steps).
    let chain: usize = match std::env::args().nth(2) {
        Some(a) => a.parse()?,
        None => STEPS,
    };
    // SAFETY: only looks for the driver library (as CudaDevice::new does).
    if !unsafe { sys::is_culib_present() } {
        println!("skipped: no NVIDIA driver (libcuda.so)");
        return Ok(());
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            println!("skipped: no GPU ({e})");
            return Ok(());
        }
    };
    // The raw driver calls below act on the thread's current context.
    ctx.bind_to_thread()?;
    let major =
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor =
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms =
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
    let cubin = turbospark_cuda::nvrtc::compile_source(SOURCE.to_string(), major, minor)?;
    let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))?;
    let k = Kernels {
        chain_step: module.load_function("chain_step")?,
        chain_tiny: module.load_function("chain_tiny")?,
        chain_empty: module.load_function("chain_empty")?,
        plain: module.load_function("persistent_plain")?,
        prefetch: module.load_function("persistent_prefetch")?,
        barriers: module.load_function("persistent_barriers")?,
        ring: RINGS
            .iter()
            .map(|r| Ok((module.load_function(r.kernel)?, *r)))
            .collect::<Result<_, Error>>()?,
        chain_ring: module.load_function("chain_ring")?,
    };
    // The ring kernels need sm_90's bulk copies (a trap before it).
    let rings: &[(CudaFunction, RingShape)] = if major >= 9 { &k.ring } else { &[] };
    let chain_rings: &[CudaFunction] = if major >= 9 {
        std::slice::from_ref(&k.chain_ring)
    } else {
        &[]
    };
    let ring_kernels = rings
        .iter()
        .map(|(f, _)| (f, RING_SMEM))
        .chain(chain_rings.iter().map(|f| (f, CHAIN_RING_SMEM)));
    for (f, smem) in ring_kernels {
        // SAFETY: a loaded function of this context; the size is within
        // what sm_90 allows a block (the launch fails otherwise).
        unsafe {
            sys::cuFuncSetAttribute(
                f.cu_function(),
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
        }
        .result()?;
        if f.occupancy_max_active_blocks_per_multiprocessor(RING_THREADS, smem, None)? < 1 {
            return Err("a ring kernel fits no SM".into());
        }
    }
    let stream = ctx.new_stream()?;
    let s = stream.cu_stream();
    let threads = (WARPS * 32) as u32;
    let resident_plain = k
        .plain
        .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
    let resident = k
        .prefetch
        .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
    println!(
        "sm_{major}{minor}, {sms} SMs; {chain} steps a chain over {STEPS} matrices of rows × {COLS} 8-bit codes; \
         persistent grids of blocks of {WARPS} warps, at most {resident_plain} an SM \
         (prefetch: {resident}) by occupancy; {replays} replays"
    );

    let max_rows = ROWS[0];
    let mut rng = 0x5eed_u64;
    let mut mats = Vec::new();
    for _ in 0..STEPS {
        let codes: Vec<i8> = (0..max_rows * COLS)
            .map(|_| (next(&mut rng) % 255) as i8)
            .collect();
        let scales: Vec<f32> = (0..max_rows * COLS / 32)
            .map(|_| 1e-3 * (1 + next(&mut rng) % 1000) as f32)
            .collect();
        mats.push((upload(&codes)?, upload(&scales)?, codes, scales));
    }
    let xq: Vec<i8> = (0..COLS).map(|_| (next(&mut rng) % 255) as i8).collect();
    let xd: Vec<f32> = (0..COLS / 32)
        .map(|_| 1e-2 * (1 + next(&mut rng) % 100) as f32)
        .collect();
    let (xq_d, xd_d) = (upload(&xq)?, upload(&xd)?);
    let w_ptrs: Vec<u64> = mats.iter().map(|m| m.0).collect();
    let d_ptrs: Vec<u64> = mats.iter().map(|m| m.1).collect();
    let (w_arr, d_arr) = (upload(&w_ptrs)?, upload(&d_ptrs)?);
    let y = upload(&vec![0f32; STEPS * max_rows])?;
    let counters = upload(&[0u32; 2])?;
    let (arrived, stuck) = (counters, counters + 4);

    let sums = upload(&[0f32; STEPS])?;

    // The variants: one launch a step (chain_step with and without
    // programmatic dependence; on sm_90 also chain_ring), and one
    // persistent launch (the register-prefetch kernels at two occupancies
    // each; on sm_90 the ring kernels, one block an SM).
    let mut chains = vec![
        ChainKernel::step("a launch a step (PDL graph)", &k.chain_step, threads, true),
        ChainKernel::step(
            "a launch a step (graph, no PDL)",
            &k.chain_step,
            threads,
            false,
        ),
    ];
    chains.extend(chain_rings.iter().map(|f| ChainKernel {
        label: "a launch a step, ring of 4 (PDL graph)",
        f,
        grid: Some(sms),
        block: RING_THREADS,
        smem: CHAIN_RING_SMEM as u32,
        takes_stuck: true,
        pdl: true,
    }));
    let mut persistents: Vec<Persistent> = [
        ("persistent, barrier", &k.plain, resident_plain),
        ("persistent, barrier", &k.plain, resident),
        ("persistent, barrier, prefetch", &k.prefetch, resident),
        (
            "persistent, barrier, prefetch",
            &k.prefetch,
            resident.div_ceil(2),
        ),
    ]
    .into_iter()
    .map(|(name, f, per_sm)| Persistent {
        label: format!("{name} ({per_sm}/SM)"),
        f,
        grid: sms * per_sm,
        block: threads,
        smem: 0,
        writes: true,
        small_steps: true,
    })
    .collect();
    // Without barriers, or with unordered arrivals, a ring run has no
    // small steps.
    persistents.extend(rings.iter().map(|(f, r)| Persistent {
        label: r.label.to_string(),
        f,
        grid: sms,
        block: RING_THREADS,
        smem: RING_SMEM as u32,
        writes: r.compute,
        small_steps: r.barrier && r.ordered,
    }));

    println!(
        "{:<44} {:>6} {:>10} {:>9} {:>9}",
        "variant (+ small: a one-block step after each)", "rows", "MB a step", "us/step", "GB/s"
    );
    for rows in ROWS {
        let bytes = rows * (COLS + COLS / 32 * 4);
        let want: Vec<Vec<(f64, f64)>> = mats
            .iter()
            .map(|m| reference(&m.2, &m.3, rows, &xq, &xd))
            .collect();
        let report = |name: &str, tiny: bool, us: f64| {
            let name = format!("{name}{}", if tiny { " + small" } else { "" });
            println!(
                "{:<44} {:>6} {:>10.2} {:>9.2} {:>9.0}",
                name,
                rows,
                bytes as f64 / 1e6,
                us,
                bytes as f64 / us / 1e3
            )
        };
        for tiny in [false, true] {
            // One launch a step (and one for each small step), recorded as
            // a graph.
            for c in &chains {
                zero(y, STEPS * max_rows)?;
                zero(sums, STEPS)?;
                let attr = || if c.pdl { Attr::Dependent } else { Attr::None };
                let grid = c.grid.unwrap_or(rows.div_ceil(WARPS) as u32);
                let graph = record(s, |s| {
                    for i in 0..chain {
                        let m = &mats[i % STEPS];
                        let i = i % STEPS;
                        let (mut w, mut d, mut r, mut xq, mut xd, mut st) =
                            (m.0, m.1, rows as i32, xq_d, xd_d, stuck);
                        let mut out = y + (i * rows * 4) as u64;
                        let mut args = vec![
                            ptr(&mut w),
                            ptr(&mut d),
                            ptr(&mut r),
                            ptr(&mut xq),
                            ptr(&mut xd),
                            ptr(&mut out),
                        ];
                        if c.takes_stuck {
                            args.push(ptr(&mut st));
                        }
                        launch_with(c.f, s, grid, c.block, c.smem, &mut args, attr())?;
                        if tiny {
                            let mut sum = sums + (i * 4) as u64;
                            let args = &mut [ptr(&mut out), ptr(&mut r), ptr(&mut sum)];
                            launch(&k.chain_tiny, s, 1, threads, args, attr())?;
                        }
                    }
                    Ok(())
                })?;
                let us = replay(s, graph, replays)? / chain as f64;
                check_stuck(stuck)?;
                check_run(y, sums, rows, &want, tiny)?;
                report(c.label, tiny, us);
            }
            // One persistent launch, the blocks meeting at a barrier a step.
            for p in &persistents {
                if tiny && !p.small_steps {
                    continue;
                }
                zero(y, STEPS * max_rows)?;
                zero(sums, STEPS)?;
                let mut steps = Steps {
                    w: w_arr,
                    d: d_arr,
                    sums,
                    steps: chain as i32,
                    rows: rows as i32,
                    tiny: tiny as i32,
                    mats: STEPS as i32,
                };
                let (mut xq, mut xd, mut out, mut a, mut st) = (xq_d, xd_d, y, arrived, stuck);
                let mut run = |s: sys::CUstream| -> Result<(), Error> {
                    // SAFETY: `arrived` is a valid device word of this context.
                    unsafe { sys::cuMemsetD32Async(arrived, 0, 1, s) }.result()?;
                    let args = &mut [
                        ptr(&mut steps),
                        ptr(&mut xq),
                        ptr(&mut xd),
                        ptr(&mut out),
                        ptr(&mut a),
                        ptr(&mut st),
                    ];
                    launch_with(p.f, s, p.grid, p.block, p.smem, args, Attr::Cooperative)
                };
                run(s)?;
                sync(s)?;
                check_stuck(stuck)?;
                let start = Instant::now();
                for _ in 0..replays {
                    run(s)?;
                }
                sync(s)?;
                let us = start.elapsed().as_secs_f64() * 1e6 / (replays * chain) as f64;
                check_stuck(stuck)?;
                if p.writes {
                    check_run(y, sums, rows, &want, tiny)?;
                }
                report(&p.label, tiny, us);
            }
        }
    }

    // The floors: an empty dependent launch, a bare barrier.
    let graph = record(s, |s| {
        for _ in 0..STEPS {
            launch(&k.chain_empty, s, sms, threads, &mut [], Attr::Dependent)?;
        }
        Ok(())
    })?;
    let us = replay(s, graph, replays * 4)? / STEPS as f64;
    println!("floor: an empty dependent launch ({sms} blocks): {us:.2} us");
    for per_sm in [1, resident] {
        let (mut n, mut a, mut st) = (STEPS as i32, arrived, stuck);
        let grid = sms * per_sm;
        let mut run = |s: sys::CUstream| -> Result<(), Error> {
            // SAFETY: as above.
            unsafe { sys::cuMemsetD32Async(arrived, 0, 1, s) }.result()?;
            let args = &mut [ptr(&mut n), ptr(&mut a), ptr(&mut st)];
            launch(&k.barriers, s, grid, threads, args, Attr::Cooperative)
        };
        run(s)?;
        sync(s)?;
        check_stuck(stuck)?;
        let start = Instant::now();
        for _ in 0..replays * 4 {
            run(s)?;
        }
        sync(s)?;
        check_stuck(stuck)?;
        let us = start.elapsed().as_secs_f64() * 1e6 / (replays * 4 * STEPS) as f64;
        println!("floor: a grid barrier ({grid} blocks, {per_sm}/SM; launch included): {us:.2} us");
    }
    Ok(())
}

struct Kernels {
    chain_step: CudaFunction,
    chain_tiny: CudaFunction,
    chain_empty: CudaFunction,
    plain: CudaFunction,
    prefetch: CudaFunction,
    barriers: CudaFunction,
    /// The persistent ring kernels and what they do.
    ring: Vec<(CudaFunction, RingShape)>,
    /// One step a launch through a ring.
    chain_ring: CudaFunction,
}

/// A one-launch-a-step kernel (`chain_step`'s parameters, and with
/// `takes_stuck` the timeout flag after them) and how it is launched: its
/// grid (None: a block of WARPS rows a block), block, shared memory, and
/// whether as a programmatic dependent of the launch before.
struct ChainKernel<'a> {
    label: &'static str,
    f: &'a CudaFunction,
    grid: Option<u32>,
    block: u32,
    smem: u32,
    takes_stuck: bool,
    pdl: bool,
}

impl<'a> ChainKernel<'a> {
    /// `chain_step`: a warp a row.
    fn step(label: &'static str, f: &'a CudaFunction, block: u32, pdl: bool) -> Self {
        ChainKernel {
            label,
            f,
            grid: None,
            block,
            smem: 0,
            takes_stuck: false,
            pdl,
        }
    }
}

/// A persistent kernel (`Steps` and the barrier words its parameters) and
/// its cooperative launch; `writes`: its outputs are checked (not so for
/// the rings whose consumers compute nothing); `small_steps`: it runs the
/// chain with small steps too.
struct Persistent<'a> {
    label: String,
    f: &'a CudaFunction,
    grid: u32,
    block: u32,
    smem: u32,
    writes: bool,
    small_steps: bool,
}

/// A persistent ring kernel of stage_sync.cu: whether its consumers
/// compute (if not, they give each slot back unread and write nothing),
/// meet at a barrier a step, and order their writes before arriving (by
/// a fence, or by waiting for the bulk copy that wrote them).
#[derive(Clone, Copy)]
struct RingShape {
    kernel: &'static str,
    label: &'static str,
    compute: bool,
    barrier: bool,
    ordered: bool,
}

const RINGS: [RingShape; 6] = [
    RingShape {
        kernel: "persistent_ring",
        label: "persistent, ring, fenced barrier",
        compute: true,
        barrier: true,
        ordered: true,
    },
    RingShape {
        kernel: "persistent_ring_idle",
        label: "persistent, ring, copies only",
        compute: false,
        barrier: true,
        ordered: true,
    },
    RingShape {
        kernel: "persistent_ring_free",
        label: "persistent, ring, no barrier",
        compute: true,
        barrier: false,
        ordered: true,
    },
    RingShape {
        kernel: "persistent_ring_idle_free",
        label: "persistent, ring, copies only, no barrier",
        compute: false,
        barrier: false,
        ordered: true,
    },
    RingShape {
        kernel: "persistent_ring_unordered",
        label: "persistent, ring, unordered barrier",
        compute: true,
        barrier: true,
        ordered: false,
    },
    RingShape {
        kernel: "persistent_ring_bulk",
        label: "persistent, ring, outputs by bulk copy, no fence",
        compute: true,
        barrier: true,
        ordered: true,
    },
];

/// Threads of a ring kernel's block: a producer warp, 8 consumer warps.
const RING_THREADS: u32 = 9 * 32;
/// A ring slot: 8 rows' codes and scales.
const RING_SLOT: usize = 8 * (COLS + COLS / 32 * 4);
/// Dynamic shared memory of the persistent rings (8 slots) and of
/// chain_ring (4): two mbarriers a slot, then the slots.
const RING_SMEM: usize = 8 * (16 + RING_SLOT);
const CHAIN_RING_SMEM: usize = 4 * (16 + RING_SLOT);

/// stage_sync.cu `Steps`, passed by value.
#[repr(C)]
struct Steps {
    w: u64,
    d: u64,
    sums: u64,
    steps: i32,
    rows: i32,
    tiny: i32,
    mats: i32,
}

enum Attr {
    None,
    Dependent,
    Cooperative,
}

fn ptr<T>(v: &mut T) -> *mut c_void {
    v as *mut T as *mut c_void
}

/// Launches `f` (1-D grid and block) with `args` pointing at its
/// parameters in order.
fn launch(
    f: &CudaFunction,
    s: sys::CUstream,
    grid: u32,
    block: u32,
    args: &mut [*mut c_void],
    attr: Attr,
) -> Result<(), Error> {
    launch_with(f, s, grid, block, 0, args, attr)
}

/// `launch` with `smem` bytes of dynamic shared memory a block.
fn launch_with(
    f: &CudaFunction,
    s: sys::CUstream,
    grid: u32,
    block: u32,
    smem: u32,
    args: &mut [*mut c_void],
    attr: Attr,
) -> Result<(), Error> {
    let mut a = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    };
    match attr {
        Attr::None => {}
        Attr::Dependent => a.value.programmaticStreamSerializationAllowed = 1,
        Attr::Cooperative => {
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            a.value.cooperative = 1;
        }
    }
    let config = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: s,
        attrs: &mut a,
        numAttrs: if matches!(attr, Attr::None) { 0 } else { 1 },
    };
    // SAFETY: `args` point at live values of the kernel's parameter types
    // in its order (each call site above builds them from locals that
    // outlive this call); `config` and `a` live until it returns.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    Ok(())
}

/// `body`'s launches on `s` recorded as a graph (instantiated).
fn record(
    s: sys::CUstream,
    body: impl FnOnce(sys::CUstream) -> Result<(), Error>,
) -> Result<sys::CUgraphExec, Error> {
    // SAFETY: a valid stream; capture ends below.
    unsafe {
        result::stream::begin_capture(
            s,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    }?;
    let recorded = body(s);
    // SAFETY: the stream is capturing.
    let graph = unsafe { result::stream::end_capture(s) }?;
    recorded?;
    // SAFETY: `graph` was just captured; destroyed once instantiated.
    let exec = unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) };
    let _ = unsafe { result::graph::destroy(graph) };
    Ok(exec?)
}

/// µs a replay of `graph` over `n` replays (after one to warm up).
fn replay(s: sys::CUstream, graph: sys::CUgraphExec, n: usize) -> Result<f64, Error> {
    // SAFETY: a valid exec and stream.
    unsafe { result::graph::launch(graph, s) }?;
    sync(s)?;
    let start = Instant::now();
    for _ in 0..n {
        // SAFETY: as above.
        unsafe { result::graph::launch(graph, s) }?;
    }
    sync(s)?;
    let us = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    // SAFETY: not used again.
    let _ = unsafe { result::graph::exec_destroy(graph) };
    Ok(us)
}

fn sync(s: sys::CUstream) -> Result<(), Error> {
    // SAFETY: a valid stream.
    unsafe { result::stream::synchronize(s) }?;
    Ok(())
}

fn upload<T>(v: &[T]) -> Result<u64, Error> {
    // SAFETY: a fresh allocation of the slice's size, filled from it; kept
    // for the process's life.
    unsafe {
        let p = result::malloc_sync(std::mem::size_of_val(v).max(4))?;
        result::memcpy_htod_sync(p, v)?;
        Ok(p)
    }
}

fn zero(p: u64, floats: usize) -> Result<(), Error> {
    // SAFETY: `p` covers `floats` words (allocated above).
    unsafe { result::memset_d8_sync(p, 0, floats * 4) }?;
    Ok(())
}

fn check_stuck(stuck: u64) -> Result<(), Error> {
    let mut v = [0u32];
    // SAFETY: `stuck` is one device word.
    unsafe { result::memcpy_dtoh_sync(&mut v, stuck) }?;
    if v[0] != 0 {
        return Err("a grid barrier timed out: not every block was resident".into());
    }
    Ok(())
}

/// Every step's outputs (`[STEPS, rows]` at `y`) against the host
/// reference: within 1e-5 of the row's Σ |terms| (the kernels sum 180 f32
/// terms in another order).
fn check(y: u64, rows: usize, want: &[Vec<(f64, f64)>]) -> Result<(), Error> {
    let mut got = vec![0f32; want.len() * rows];
    // SAFETY: `y` holds STEPS × the largest rows floats.
    unsafe { result::memcpy_dtoh_sync(&mut got, y) }?;
    check_values(&got, rows, want)
}

fn check_values(got: &[f32], rows: usize, want: &[Vec<(f64, f64)>]) -> Result<(), Error> {
    for (k, w) in want.iter().enumerate() {
        for (r, &(e, size)) in w.iter().enumerate() {
            let g = got[k * rows + r] as f64;
            if (g - e).abs() > 1e-5 * size {
                return Err(format!("step {k} row {r}: {g}, the reference {e}").into());
            }
        }
    }
    Ok(())
}

/// A run's outputs (and with `tiny` its small steps' sums) against the
/// reference.
fn check_run(
    y: u64,
    sums: u64,
    rows: usize,
    want: &[Vec<(f64, f64)>],
    tiny: bool,
) -> Result<(), Error> {
    check(y, rows, want)?;
    if tiny {
        check_sums(sums, want)?;
    }
    Ok(())
}

/// The small steps' sums (`[STEPS]` at `sums`) against the sums of the
/// reference rows: within 1e-4 of the rows' Σ |terms|.
fn check_sums(sums: u64, want: &[Vec<(f64, f64)>]) -> Result<(), Error> {
    let mut got = vec![0f32; want.len()];
    // SAFETY: `sums` holds STEPS floats.
    unsafe { result::memcpy_dtoh_sync(&mut got, sums) }?;
    for (k, w) in want.iter().enumerate() {
        let (e, size) = w.iter().fold((0.0, 0.0), |(a, m), &(t, u)| (a + t, m + u));
        if (got[k] as f64 - e).abs() > 1e-4 * size {
            return Err(format!("small step {k}: {}, the reference {e}", got[k]).into());
        }
    }
    Ok(())
}

/// y[row] = Σ_b dw_b · dx_b · Σ_{i in b} w_i x_i in f64, with the sum of
/// the terms' magnitudes.
fn reference(codes: &[i8], scales: &[f32], rows: usize, xq: &[i8], xd: &[f32]) -> Vec<(f64, f64)> {
    (0..rows)
        .map(|r| {
            (0..COLS / 32)
                .map(|b| {
                    let s: i64 = (0..32)
                        .map(|i| codes[r * COLS + b * 32 + i] as i64 * xq[b * 32 + i] as i64)
                        .sum();
                    let t = s as f64 * scales[r * COLS / 32 + b] as f64 * xd[b] as f64;
                    (t, t.abs())
                })
                .fold((0.0, 0.0), |(a, m), (t, u)| (a + t, m + u))
        })
        .collect()
}

/// xorshift64.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
