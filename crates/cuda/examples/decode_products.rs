//! Bandwidth of the fast-numerics matrix-vector products of a decode step
//! on the GPU, shape by shape: the gpt-oss-20b shapes (the grouped q/k/v
//! rows, the o projection, the router and the output head, Q8_0; the
//! projections and router again in bf16; MXFP4 rows of an expert's gate
//! and down widths) and three of K-quant and
//! Q4_0 models ([`SHAPES`]), one token, the
//! product alone in a loop. Each shape is uploaded in enough copies (more
//! than the 60 MB L2 together) that every call reads its weights from
//! HBM, as a decode step does; the loop's wall time over the calls gives
//! µs a call and GB/s of weight bytes. Each call reads one of two input
//! buffers in turn, so it quantizes its input and launches its product
//! alone (two launches, as the o projection of a decode step; products
//! of one input would otherwise join one grouped launch, see
//! crate::fusion). Launch gaps are in the first figure, as in a stream;
//! the second ("graph") records the same calls as one step and replays
//! it, as a decode step runs (dependent launches, no host launch cost). Then the routed experts of one token as a decode step
//! runs them (`moe_experts`: the input's quantization, the grouped gate
//! and up products with the GLU, the activations' quantization, the down
//! products; 4 of 32 MXFP4 experts of 2880 × 2880, banks and routes
//! rotated past the L2). `DECODE_PRODUCTS_COPIES=1` uploads each shape
//! once instead, so weights that fit stay in the L2 between calls: the
//! ceiling of any scheme that warms the L2 ahead of a product. Then the
//! launch floor: a recorded
//! step of as many tiny element-wise kernels as a gpt-oss decode step
//! launches (16 a layer, 24 layers), replayed as a graph, gives the cost
//! of one dependent kernel that moves almost nothing — what fusion can
//! save. Prints "skipped" without a GPU.
//!
//! `cargo run --release -p turbospark-cuda --example decode_products [CALLS]`
//! (`TURBOSPARK_CUDA_PDL=0` to compare launches without programmatic
//! dependence).

use std::time::Instant;
use turbospark_backend::conformance::data::{random_matrix, Rng};
use turbospark_backend::{
    BackendError, DType, Device, ExpertTensors, ExpertWeights, Limits, MoeInput, MoeScratch,
    Numerics, Route, Stream,
};
use turbospark_core::arch::Activation;
use turbospark_core::QuantFormat;
use turbospark_cuda::{CudaDevice, CudaStream};

/// (name, format, rows, cols): gpt-oss-20b's (its layer's projections
/// and router also in bf16, gpt-oss's own format, which take the tensor
/// cores: kernels/tcmm.cu), then a Q4_K_M GGUF's of an
/// 8B Llama (the ffn's gate rows and its Q6_K down rows) and a Q4_0 square,
/// whose formats take the tensor cores decoded to bf16 (kernels/tcmm.cu;
/// `TURBOSPARK_CUDA_BF16=bf16` puts them back on matmul.cu's kernel).
const SHAPES: [(&str, QuantFormat, usize, usize); 12] = [
    ("q/k/v (grouped rows)", QuantFormat::Q8_0, 5120, 2880),
    ("o projection", QuantFormat::Q8_0, 2880, 4096),
    ("router", QuantFormat::Q8_0, 32, 2880),
    ("q/k/v, bf16", QuantFormat::Bf16, 5120, 2880),
    ("o projection, bf16", QuantFormat::Bf16, 2880, 4096),
    ("router, bf16", QuantFormat::Bf16, 32, 2880),
    ("output head", QuantFormat::Q8_0, 201088, 2880),
    ("expert gate+up rows", QuantFormat::Mxfp4, 5760, 2880),
    ("expert down rows", QuantFormat::Mxfp4, 2880, 2880),
    ("8B ffn gate rows", QuantFormat::Q4K, 14336, 4096),
    ("8B ffn down rows", QuantFormat::Q6K, 4096, 14336),
    ("4096 square", QuantFormat::Q4_0, 4096, 4096),
];

/// Bytes of copies of one shape that together overflow the L2.
const ROTATION_BYTES: usize = 192 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let calls: usize = match std::env::args().nth(1) {
        Some(a) => a.parse()?,
        None => 200,
    };
    let dev = match CudaDevice::new(0, Numerics::Fast) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    println!(
        "{} (sm_{}{}), {calls} calls a shape, one token",
        dev.gpu_name(),
        dev.capability().0,
        dev.capability().1
    );
    println!(
        "{:<22} {:>7} {:>8} {:>6} {:>9} {:>9} {:>8} {:>9} {:>8}",
        "product", "format", "rows", "cols", "MB", "us/call", "GB/s", "graph us", "GB/s"
    );
    for (name, fmt, rows, cols) in SHAPES {
        let mut rng = Rng(0x0dec0de ^ rows as u64);
        let t = random_matrix(name, fmt, rows, cols, &mut rng);
        let bytes = t.bytes.len();
        // DECODE_PRODUCTS_COPIES=1: one copy, whose weights stay in the L2
        // between calls where they fit (the ceiling of an L2 warm-up).
        let copies = match std::env::var("DECODE_PRODUCTS_COPIES")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            Some(c) => c,
            None => ROTATION_BYTES.div_ceil(bytes),
        }
        .max(1);
        let ms = (0..copies)
            .map(|_| dev.upload_matrix(&t))
            .collect::<Result<Vec<_>, _>>()?;
        let limits = Limits {
            max_tokens: 1,
            ..Limits::default()
        };
        let mut st = dev.stream(&limits)?;
        let input: Vec<f32> = rng.scaled(cols, 1.0);
        let mut xs = [dev.alloc(DType::F32, cols)?, dev.alloc(DType::F32, cols)?];
        for x in &mut xs {
            st.write(x, &input)?;
        }
        let mut out = dev.alloc(DType::F32, rows)?;
        // Warm-up: module load, scratch growth, the first of every copy.
        for (i, m) in ms.iter().enumerate() {
            st.matmul(m, &xs[i % 2], 1, &mut out)?;
        }
        st.synchronize()?;
        let times = time_calls(&mut st, calls, copies.max(8), |st, i| {
            st.matmul(&ms[i % copies], &xs[i % 2], 1, &mut out)
        })?;
        print_row(name, fmt.name(), rows, cols, bytes, times);
    }
    routed_experts(&dev, calls)?;
    launch_floor(&dev)?;
    Ok(())
}

/// µs a call of `call(st, i)`: `calls` calls queued on the stream (host
/// launches included), then `recorded` of them recorded as one step and
/// replayed (kernel time and the dependent-launch gaps of a decode graph,
/// no host launches).
fn time_calls(
    st: &mut CudaStream,
    calls: usize,
    recorded: usize,
    mut call: impl FnMut(&mut CudaStream, usize) -> Result<(), BackendError>,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let start = Instant::now();
    for i in 0..calls {
        call(st, i)?;
    }
    st.synchronize()?;
    let queued = start.elapsed().as_secs_f64() * 1e6 / calls as f64;
    st.begin_step(0, 1)?;
    for i in 0..recorded {
        call(st, i)?;
    }
    st.end_step()?;
    st.replay_step(0, 1)?;
    st.synchronize()?;
    let replays = calls.div_ceil(recorded).max(2);
    let start = Instant::now();
    for _ in 0..replays {
        st.replay_step(0, 1)?;
    }
    st.synchronize()?;
    let replayed = start.elapsed().as_secs_f64() * 1e6 / (replays * recorded) as f64;
    Ok((queued, replayed))
}

/// A row of the table: the product, its weight bytes, and µs a call and
/// GB/s queued and replayed ([`time_calls`]).
fn print_row(
    name: &str,
    fmt: &str,
    rows: usize,
    cols: usize,
    bytes: usize,
    (us, graph_us): (f64, f64),
) {
    let gb_s = |us: f64| bytes as f64 / us / 1e3;
    println!(
        "{:<22} {:>7} {:>8} {:>6} {:>9.2} {:>9.2} {:>8.0} {:>9.2} {:>8.0}",
        name,
        fmt,
        rows,
        cols,
        bytes as f64 / 1e6,
        us,
        gb_s(us),
        graph_us,
        gb_s(graph_us)
    );
}

/// gpt-oss-20b's expert shape: hidden, intermediate, experts, top-k.
const MOE_SHAPE: (usize, usize, usize, usize) = (2880, 2880, 32, 4);

/// µs and GB/s of weight bytes of one token's routed experts.
fn routed_experts(dev: &CudaDevice, calls: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (hidden, inter, experts, top_k) = MOE_SHAPE;
    let mut rng = Rng(0xe4be47);
    let tensors: Vec<ExpertTensors> = (0..experts)
        .map(|e| ExpertWeights {
            gate: random_matrix(
                &format!("gate{e}"),
                QuantFormat::Mxfp4,
                inter,
                hidden,
                &mut rng,
            ),
            up: random_matrix(
                &format!("up{e}"),
                QuantFormat::Mxfp4,
                inter,
                hidden,
                &mut rng,
            ),
            down: random_matrix(
                &format!("down{e}"),
                QuantFormat::Mxfp4,
                hidden,
                inter,
                &mut rng,
            ),
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        })
        .collect();
    let expert_bytes: usize = [&tensors[0].gate, &tensors[0].up, &tensors[0].down]
        .iter()
        .map(|t| t.bytes.len())
        .sum();
    // Three banks (about 1.3 GB) and eight route sets, rotated.
    let banks = (0..3)
        .map(|_| dev.upload_bank(&tensors))
        .collect::<Result<Vec<_>, _>>()?;
    let mut st = dev.stream(&Limits {
        max_tokens: 1,
        max_routes: top_k,
        max_expert_intermediate: inter,
        ..Limits::default()
    })?;
    let mut routes = Vec::new();
    for set in 0..8u32 {
        let picked: Vec<Route> = (0..top_k as u32)
            .map(|r| Route {
                slot: (set * 7 + r * 9) % experts as u32,
                weight: 0.25,
            })
            .collect();
        let mut rb = dev.alloc_routes(1, top_k)?;
        st.write_routes(&mut rb, &picked)?;
        routes.push(rb);
    }
    let mut x = dev.alloc(DType::F32, hidden)?;
    st.write(&mut x, &rng.scaled(hidden, 1.0))?;
    let mut scratch = MoeScratch {
        x: dev.alloc(DType::F32, hidden)?,
        gate: dev.alloc(DType::F32, inter)?,
        up: dev.alloc(DType::F32, inter)?,
        y: dev.alloc(DType::F32, top_k * hidden)?,
    };
    let input = |i: usize| MoeInput::<CudaDevice> {
        x: &x,
        n_tokens: 1,
        routes: &routes[i % routes.len()],
        bank: &banks[i % banks.len()],
        activation: Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        },
    };
    for i in 0..24 {
        st.moe_experts(input(i), &mut scratch, None)?;
    }
    st.synchronize()?;
    let times = time_calls(&mut st, calls, 24, |st, i| {
        st.moe_experts(input(i), &mut scratch, None)
    })?;
    print_row(
        "routed experts (4/32)",
        "mxfp4",
        top_k * (2 * inter + hidden),
        hidden,
        top_k * expert_bytes,
        times,
    );
    Ok(())
}

/// Kernels of a recorded decode step of the gpt-oss-20b shape (16 a
/// layer, 24 layers).
const STEP_KERNELS: usize = 16 * 24;

/// µs a kernel in a replayed step of [`STEP_KERNELS`] tiny dependent
/// kernels (each scales a hidden-size vector).
fn launch_floor(dev: &CudaDevice) -> Result<(), Box<dyn std::error::Error>> {
    let mut st = dev.stream(&Limits {
        max_tokens: 1,
        ..Limits::default()
    })?;
    let mut x = dev.alloc(DType::F32, 2880)?;
    st.write(&mut x, &vec![1.0f32; 2880])?;
    st.synchronize()?;
    st.begin_step(0, 1)?;
    for _ in 0..STEP_KERNELS {
        st.scale(&mut x, 2880, 1.0)?;
    }
    st.end_step()?;
    st.synchronize()?;
    let replays = 50;
    let start = Instant::now();
    for _ in 0..replays {
        if !st.replay_step(0, 1)? {
            println!("launch floor: no recorded step to replay");
            return Ok(());
        }
    }
    st.synchronize()?;
    let us = start.elapsed().as_secs_f64() * 1e6 / replays as f64;
    println!(
        "launch floor: a replayed step of {STEP_KERNELS} tiny dependent kernels takes {us:.1} us \
         ({:.2} us a kernel)",
        us / STEP_KERNELS as f64
    );
    Ok(())
}
