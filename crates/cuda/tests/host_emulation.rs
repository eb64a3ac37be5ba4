//! CUDA kernels run on the CPU (no GPU needed): `tests/emulation` compiles
//! kernel sources as host C++ against a warp emulator (fibers for the
//! threads; shuffles, `__syncthreads` and the MMAs as exchanges between
//! them) and compares outputs bit for bit with a scalar reference of the
//! fast numerics' sum order (the integer products), or between kernels
//! that must agree (bf16, whose MMA rounding the emulator does not
//! reproduce). Skips with a message when no C++ compiler (`$CXX`, else
//! `c++`) is found.

use std::path::Path;
use std::process::Command;

fn compiler() -> Option<String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let found = Command::new(&cxx)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    found.then_some(cxx)
}

/// Builds `tests/emulation/{name}.cpp` and runs it; its exit status says
/// whether every output matched. Without a compiler it skips, unless
/// `TURBOSPARK_REQUIRE_CXX` is set (scripts/test.sh sets it once it has
/// one), which makes that a failure.
fn build_and_run(name: &str) {
    let Some(cxx) = compiler() else {
        assert!(
            std::env::var_os("TURBOSPARK_REQUIRE_CXX").is_none(),
            "TURBOSPARK_REQUIRE_CXX is set but no C++ compiler ($CXX, else c++) runs"
        );
        eprintln!("skipped: no C++ compiler (set CXX, or install g++) to build tests/emulation");
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulation");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("emulation-{name}"));
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-w", "-o"])
        .arg(&exe)
        .arg(dir.join(format!("{name}.cpp")))
        .output()
        .expect("running the C++ compiler");
    assert!(
        built.status.success(),
        "{cxx} could not build tests/emulation/{name}.cpp:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&exe).output().expect("running the emulation");
    let out = String::from_utf8_lossy(&run.stdout);
    eprintln!("{out}");
    assert!(
        run.status.success(),
        "tests/emulation/{name}: some kernel's outputs differ from the reference (above); {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// One token's MXFP4 routed experts: q8mma.cu's tensor-core kernels (and,
/// checking the emulator itself, q8dot.cu's and mmq.cu's, which the GPU
/// conformance suite has passed) give the reference's bits.
#[test]
fn mxfp4_expert_kernels_match_the_reference_order_bit_for_bit() {
    build_and_run("mxfp4_experts");
}

/// One token's Q8_0 products: q8mma.cu's tensor-core kernel (and q8one.cu's
/// and q8dot.cu's, which the GPU conformance suite has passed) give the
/// reference's bits, biases and q/k/v groups included.
#[test]
fn q8_0_one_token_products_match_the_reference_order_bit_for_bit() {
    build_and_run("q8_0_products");
}

/// bf16 products on the tensor cores (tcmm.cu): a token's bits are the
/// same by segments, by whole rows and in a batch, and the batch is
/// within f32 rounding of the f64 sums; rows of 1–3 segments included
/// (their blocks have fewer threads than a tile's outputs).
#[test]
fn bf16_tensor_core_products_agree_bit_for_bit() {
    build_and_run("bf16_products");
}

/// Tensor-core products of weights in every other format (tcmm.cu, weights
/// decoded to bf16): the decoding gives load_unit's values, and every
/// kernel the bits of the bf16 kernels on those values rounded to bf16,
/// at the least alignment the format is promised.
#[test]
fn decoded_tensor_core_products_agree_bit_for_bit() {
    build_and_run("tc_products");
}

/// Routed experts on the tensor cores (tcmoe.cu) in the decoded formats
/// and bf16: route by route, grouped by expert and by the dense kernels,
/// every activation and output the same bits; masked slots and routes
/// past the bank write nothing.
#[test]
fn tensor_core_experts_agree_bit_for_bit() {
    build_and_run("tc_experts");
}

/// Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 and Q5_1 products against 8-bit activations (kq.cu, the
/// default; `TURBOSPARK_CUDA_KQ=tc` decodes them for the tensor cores): the matrix-vector kernels (1 to 6 tokens,
/// q/k/v groups with biases) and the integer tensor-core batch kernel give
/// the bits of a scalar reference of kq.cu's sum order, written from
/// ggml's definitions of the formats.
#[test]
fn k_quant_integer_products_match_the_reference_order_bit_for_bit() {
    build_and_run("kq_products");
}

/// Routed experts of K-quant and legacy banks against 8-bit activations (kq.cu,
/// the default): route by route and grouped by expert
/// on the integer tensor cores, every activation and output the bits of
/// the scalar reference with moe.cu's activation and biases; masked slots
/// and routes past the bank write nothing.
#[test]
fn k_quant_integer_experts_match_the_reference_order_bit_for_bit() {
    build_and_run("kq_experts");
}

/// The scalar attention's long form (attention.cu `attention_long_*`,
/// taken past the shared memory of its scores): bit for bit the one-pass
/// kernels' output and quantization, over windows, wrapped rings,
/// soft-caps, sinks, grouped heads, f32 and f16 caches and heads 40, 64,
/// 128 and 256 wide, with chunks of a few hundred keys.
#[test]
fn long_scalar_attention_matches_the_one_pass_kernels_bit_for_bit() {
    build_and_run("attention_long");
}

/// Prefill attention on the tensor cores (attention_tc.cu): within the
/// f16 roundings of the f64 formula, with sinks, a sliding window over a
/// ring, a soft-cap, grouped query heads, heads 64 and 128 wide and
/// partial tiles of tokens.
#[test]
fn tensor_core_prefill_attention_matches_the_formula() {
    build_and_run("attention_tc");
}

/// One token's attention on the tensor cores (attention_dec.cu), beside
/// attention.cu's split kernel on the same inputs: within the f16
/// roundings of the f64 formula, with more splits than the finishing block
/// adds at once, empty splits, one split, sinks, a wrapped sliding ring,
/// a soft-cap, groups of 1 to 8 query heads and heads 64 and 128 wide.
#[test]
fn tensor_core_decode_attention_matches_the_formula() {
    build_and_run("attention_decode_tc");
}
