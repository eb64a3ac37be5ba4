//! The llama.cpp numerics of the CPU backend (`Numerics::LlamaCpp`) against
//! scalar transcriptions of ggml's C code, written here from llama.cpp's
//! sources (commit 0c1e570, vendored in llama-cpp-python 0.3.36) and
//! operating on ggml's byte layouts, independently of the backend's code:
//!
//! - activation quantizers: the reference `quantize_row_q8_0_ref`,
//!   `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref` (`ggml-quants.c`;
//!   Q8_0 also against `turbospark_core::quant::quantize_row_q8_0`, which is
//!   bit-exact with gguf-py) and the x86 versions llama.cpp runs
//!   (`quantize_row_q8_0`, `quantize_row_q8_1` in `arch/x86/quants.c`,
//!   `ggml_quantize_mat_q8_K_4x8` in `arch/x86/repack.cpp`), bit for bit;
//! - matmuls per weight format: bit for bit against the x86 kernels
//!   (`ggml_vec_dot_*` in `arch/x86/quants.c`, the repacked Q4_K gemv/gemm
//!   in `arch/x86/repack.cpp`, `ggml_vec_dot_f16` and tinyBLAS for float
//!   weights), transcribed lane by lane; and to rounding against the
//!   reference `ggml_vec_dot_*_generic` (`ggml-cpu/quants.c`), which sum
//!   the same integers in another float order.
//!
//! The end-to-end check (the same logits as llama.cpp on real models) is
//! `crates/cli/tests/llamacpp_parity.rs`.

use turbospark_backend::conformance::data::{random_matrix, Rng};
use turbospark_backend::{DType, Device, HostTensor, Limits, Numerics, SharedBytes, Stream};
use turbospark_core::quant::quantize_row_q8_0 as core_quantize_q8_0;
use turbospark_core::QuantFormat;
use turbospark_cpu::ggml::quantize::{self as q, BlockQ8, BlockQ8K};
use turbospark_cpu::{CpuDevice, CpuStream};

// ---- ggml primitives -------------------------------------------------------

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// `MAX(a, b)`.
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// ggml's `nearest_int`: round half to even through the f32 mantissa.
fn nearest_int(f: f32) -> i32 {
    let val = f + 12582912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `GGML_E8M0_TO_FP32_HALF`.
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((u32::from(e) - 1) << 23)
    }
}

const KVALUES_MXFP4: [i32; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `hsum_float_8`: extract the high half, add, then `movehl`, `movehdup`.
fn hsum_float_8(v: [f32; 8]) -> f32 {
    let r = [v[4] + v[0], v[5] + v[1], v[6] + v[2], v[7] + v[3]];
    let r2 = [r[0] + r[2], r[1] + r[3]];
    r2[0] + r2[1]
}

/// `_mm512_reduce_add_ps` (GCC): halves, then quarters, then pairs.
fn reduce_add_ps_512(v: &[f32]) -> f32 {
    let t3: Vec<f32> = (0..8).map(|i| v[8 + i] + v[i]).collect();
    let t6: Vec<f32> = (0..4).map(|i| t3[4 + i] + t3[i]).collect();
    let t8 = [t6[0] + t6[2], t6[1] + t6[3]];
    t8[0] + t8[1]
}

/// The eight 32-bit lanes `dpbusd` / `maddubs`+`madd` leave: lane `l`
/// sums the products of bytes `4l … 4l + 3`.
fn quads(x: &[i32], y: &[i8]) -> [i32; 8] {
    std::array::from_fn(|l| (0..4).map(|k| x[4 * l + k] * i32::from(y[4 * l + k])).sum())
}

/// `get_scale_min_k4`.
fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(q[j] & 63), i32::from(q[j + 4] & 63))
    } else {
        (
            i32::from((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
            i32::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4)),
        )
    }
}

// ---- quantizers, on ggml's byte layouts ----------------------------------------

/// `quantize_row_q8_0_ref`.
fn ref_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |m, v| max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16_bytes(d));
        out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
    }
    out
}

/// `quantize_row_q8_1_ref`.
fn ref_q8_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let amax = b.iter().fold(0.0f32, |m, v| max(m, v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let qs: Vec<i8> = b.iter().map(|&v| (v * id).round() as i8).collect();
        let sum: i32 = qs.iter().map(|&v| i32::from(v)).sum();
        out.extend(f16_bytes(d));
        out.extend(f16_bytes(sum as f32 * d));
        out.extend(qs.iter().map(|&v| v as u8));
    }
    out
}

/// A Q8_K block from codes and scale.
fn q8_k_bytes(d: f32, qs: &[i32]) -> Vec<u8> {
    let mut out = d.to_le_bytes().to_vec();
    out.extend(qs.iter().map(|&v| v as i8 as u8));
    for g in qs.chunks(16) {
        out.extend((g.iter().sum::<i32>() as i16).to_le_bytes());
    }
    out
}

/// `quantize_row_q8_K_ref`.
fn ref_q8_k(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(256) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in b {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            out.extend(q8_k_bytes(0.0, &[0; 256]));
            continue;
        }
        let iscale = -127.0 / max;
        let qs: Vec<i32> = b
            .iter()
            .map(|&v| nearest_int(iscale * v).min(127))
            .collect();
        out.extend(q8_k_bytes(1.0 / iscale, &qs));
    }
    out
}

/// x86 `quantize_row_q8_0` / `quantize_row_q8_1`: `127 / maxScalar`,
/// `_mm256_round_ps` to nearest even.
fn x86_q8(x: &[f32], with_sum: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(32) {
        let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = m / 127.0;
        let id = if m != 0.0 { 127.0 / m } else { 0.0 };
        let qs: Vec<i32> = b.iter().map(|&v| nearest_int(v * id)).collect();
        out.extend(f16_bytes(d));
        if with_sum {
            out.extend(f16_bytes(d * qs.iter().sum::<i32>() as f32));
        }
        out.extend(qs.iter().map(|&v| v as i8 as u8));
    }
    out
}

/// x86 `ggml_quantize_mat_q8_K_4x8`, one row.
fn x86_q8_k_4x8(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(256) {
        let m = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let positive_max = b.contains(&m);
        let iscale = match (m != 0.0, positive_max) {
            (false, _) => 0.0,
            (true, true) => -127.0 / m,
            (true, false) => 127.0 / m,
        };
        let qs: Vec<i32> = b
            .iter()
            .map(|&v| nearest_int(v * iscale).clamp(-128, 127))
            .collect();
        out.extend(q8_k_bytes(if m != 0.0 { 1.0 / iscale } else { 0.0 }, &qs));
    }
    out
}

fn q8_0_bytes(b: &[BlockQ8]) -> Vec<u8> {
    b.iter().flat_map(|b| b.q8_0_bytes()).collect()
}
fn q8_1_bytes(b: &[BlockQ8]) -> Vec<u8> {
    b.iter().flat_map(|b| b.q8_1_bytes()).collect()
}
fn q8_k_blocks_bytes(b: &[BlockQ8K]) -> Vec<u8> {
    b.iter().flat_map(|b| b.bytes()).collect()
}

/// Inputs with wide magnitudes, exact zeros, whole blocks of zeros and
/// blocks whose scaled values land on rounding ties.
fn activations(n: usize, rng: &mut Rng) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n)
        .map(|i| {
            let v = rng.f32();
            match i % 7 {
                0 => v * 40.0,
                3 => 0.0,
                _ => v * (1.0 + (i % 13) as f32),
            }
        })
        .collect();
    if n >= 512 {
        x[256..288].fill(0.0);
        // amax 127 (so id = 1) with .5 values: ties for both roundings.
        for (j, v) in x[320..352].iter_mut().enumerate() {
            *v = if j == 0 { 127.0 } else { j as f32 - 15.5 };
        }
        // +amax and −amax in one 256-block: the two Q8_K sign rules differ.
        x[1] = -50.0;
        x[2] = 50.0;
    }
    x
}

#[test]
fn reference_q8_0_is_the_core_quantizer() {
    let mut rng = Rng(11);
    let x = activations(1024, &mut rng);
    let mut ours = vec![BlockQ8::ZERO; 32];
    q::quantize_row_q8_0_ref(&x, &mut ours);
    let mut core = vec![0u8; 32 * 34];
    core_quantize_q8_0(&x, &mut core).unwrap();
    assert_eq!(q8_0_bytes(&ours), core);
    assert_eq!(q8_0_bytes(&ours), ref_q8_0(&x));
}

#[test]
fn quantizers_match_ggml_bit_for_bit() {
    let mut rng = Rng(12);
    for _ in 0..20 {
        let x = activations(1024, &mut rng);
        let mut b8 = vec![BlockQ8::ZERO; 32];
        q::quantize_row_q8_1_ref(&x, &mut b8);
        assert_eq!(q8_1_bytes(&b8), ref_q8_1(&x), "q8_1 reference");
        q::quantize_row_q8_0(&x, &mut b8);
        assert_eq!(q8_0_bytes(&b8), x86_q8(&x, false), "q8_0 x86");
        q::quantize_row_q8_1(&x, &mut b8);
        assert_eq!(q8_1_bytes(&b8), x86_q8(&x, true), "q8_1 x86");
        let mut bk = vec![BlockQ8K::ZERO; 4];
        q::quantize_row_q8_k(&x, &mut bk);
        assert_eq!(q8_k_blocks_bytes(&bk), ref_q8_k(&x), "q8_K reference");
        q::quantize_row_q8_k_gemm(&x, &mut bk);
        assert_eq!(q8_k_blocks_bytes(&bk), x86_q8_k_4x8(&x), "q8_K 4x8");
    }
}

#[test]
fn x86_and_reference_q8_0_differ_only_at_ties() {
    let mut rng = Rng(13);
    let x = activations(4096, &mut rng);
    let (mut x86, mut reference) = (vec![BlockQ8::ZERO; 128], vec![BlockQ8::ZERO; 128]);
    q::quantize_row_q8_0(&x, &mut x86);
    q::quantize_row_q8_0_ref(&x, &mut reference);
    let mut differing = 0;
    for (a, b) in x86.iter().zip(&reference) {
        assert_eq!(a.d, b.d);
        for (&u, &v) in a.qs.iter().zip(&b.qs) {
            assert!((i32::from(u) - i32::from(v)).abs() <= 1);
            differing += usize::from(u != v);
        }
    }
    // The tie block alone differs in its 16 negative and positive halves.
    assert!(differing > 0 && differing < 64, "{differing} codes differ");
}

// ---- matmul kernels, on ggml's byte layouts ------------------------------------

/// Codes of a 32-element nibble block (`bytes_from_nibbles_32`): element
/// `j < 16` is the low nibble of byte `j`, element `j ≥ 16` the high
/// nibble of byte `j − 16`.
fn nibbles(qs: &[u8]) -> [i32; 32] {
    std::array::from_fn(|j| {
        if j < 16 {
            i32::from(qs[j] & 0xF)
        } else {
            i32::from(qs[j - 16] >> 4)
        }
    })
}

fn fifth_bit(qh: &[u8], j: usize) -> bool {
    (u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]) >> j) & 1 == 1
}

fn i8s(b: &[u8]) -> Vec<i8> {
    b.iter().map(|&v| v as i8).collect()
}

/// The x86 `ggml_vec_dot_<fmt>_q8_*` of one weight row and one activation
/// row in its `vec_dot_type` bytes.
fn x86_vec_dot(fmt: QuantFormat, w: &[u8], a: &[u8]) -> f32 {
    let bb = fmt.block_bytes();
    match fmt {
        QuantFormat::Q8_0 | QuantFormat::Q4_0 | QuantFormat::Q5_0 => {
            let mut acc = [0f32; 8];
            for (x, y) in w.chunks(bb).zip(a.chunks(34)) {
                let d = f16_at(x, 0) * f16_at(y, 0);
                let qx: Vec<i32> = match fmt {
                    QuantFormat::Q8_0 => x[2..34].iter().map(|&v| i32::from(v as i8)).collect(),
                    QuantFormat::Q4_0 => nibbles(&x[2..18]).iter().map(|v| v - 8).collect(),
                    _ => nibbles(&x[6..22])
                        .iter()
                        .enumerate()
                        .map(|(j, &v)| {
                            (v | if fifth_bit(&x[2..6], j) { 0 } else { 0xF0 }) as u8 as i8
                        })
                        .map(i32::from)
                        .collect(),
                };
                let q = quads(&qx, &i8s(&y[2..34]));
                for l in 0..8 {
                    acc[l] = d.mul_add(q[l] as f32, acc[l]);
                }
            }
            hsum_float_8(acc)
        }
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
            let mut acc = [0f32; 8];
            let mut summs = 0f32;
            let qs_at = if fmt == QuantFormat::Q4_1 { 4 } else { 8 };
            for (x, y) in w.chunks(bb).zip(a.chunks(36)) {
                summs = f16_at(x, 2).mul_add(f16_at(y, 2), summs);
                let d = f16_at(x, 0) * f16_at(y, 0);
                let qx: Vec<i32> = nibbles(&x[qs_at..qs_at + 16])
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        let high = fmt == QuantFormat::Q5_1 && fifth_bit(&x[4..8], j);
                        v | if high { 16 } else { 0 }
                    })
                    .collect();
                let q = quads(&qx, &i8s(&y[4..36]));
                for l in 0..8 {
                    acc[l] = d.mul_add(q[l] as f32, acc[l]);
                }
            }
            hsum_float_8(acc) + summs
        }
        QuantFormat::Mxfp4 => {
            let blocks: Vec<(&[u8], &[u8])> = w.chunks(bb).zip(a.chunks(34)).collect();
            let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
            let lanes = |x: &[u8], y: &[u8]| {
                let qx: Vec<i32> = nibbles(&x[1..17])
                    .iter()
                    .map(|&v| KVALUES_MXFP4[v as usize])
                    .collect();
                (f16_at(y, 0) * e8m0_half(x[0]), quads(&qx, &i8s(&y[2..34])))
            };
            let mut ib = 0;
            while ib + 1 < blocks.len() {
                let (d0, q0) = lanes(blocks[ib].0, blocks[ib].1);
                let (d1, q1) = lanes(blocks[ib + 1].0, blocks[ib + 1].1);
                for l in 0..8 {
                    acc1[l] = d0.mul_add(q0[l] as f32, acc1[l]);
                    acc2[l] = d1.mul_add(q1[l] as f32, acc2[l]);
                }
                ib += 2;
            }
            let mut sumf = hsum_float_8(std::array::from_fn(|l| acc1[l] + acc2[l]));
            for &(x, y) in &blocks[ib..] {
                let (d, q) = lanes(x, y);
                sumf = d.mul_add(q.iter().sum::<i32>() as f32, sumf);
            }
            sumf
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let mut acc = [0f32; 8];
            let mut acc_m = [0f32; 4];
            let mut summs = 0f32;
            for (x, y) in w.chunks(bb).zip(a.chunks(292)) {
                let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                let d = yd * f16_at(x, 0);
                let dmin = -yd * f16_at(x, 2);
                let bsums: Vec<i32> = y[260..292]
                    .chunks(2)
                    .map(|b| i32::from(i16::from_le_bytes([b[0], b[1]])))
                    .collect();
                let q8s: Vec<i32> = (0..8).map(|s| bsums[2 * s] + bsums[2 * s + 1]).collect();
                let mins: Vec<i32> = (0..8).map(|s| scale_min_k4(s, &x[4..16]).1).collect();
                let prod: Vec<i32> = (0..4)
                    .map(|k| mins[2 * k] * q8s[2 * k] + mins[2 * k + 1] * q8s[2 * k + 1])
                    .collect();
                if fmt == QuantFormat::Q4K {
                    for k in 0..4 {
                        acc_m[k] = dmin.mul_add(prod[k] as f32, acc_m[k]);
                    }
                } else {
                    summs = dmin.mul_add(prod.iter().sum::<i32>() as f32, summs);
                }
                let mut sumi = [0i32; 8];
                for s in 0..8 {
                    let (sc, _) = scale_min_k4(s, &x[4..16]);
                    let qx: Vec<i32> = (0..32)
                        .map(|l| {
                            let (qs, qh) = if fmt == QuantFormat::Q4K {
                                (&x[16..144], None)
                            } else {
                                (&x[48..176], Some(&x[16..48]))
                            };
                            let v = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
                            let h = qh.map_or(0, |qh| ((qh[l] >> s) & 1) << 4);
                            i32::from(v | h)
                        })
                        .collect();
                    let q = quads(&qx, &i8s(&y[4 + 32 * s..4 + 32 * s + 32]));
                    for l in 0..8 {
                        sumi[l] += sc * q[l];
                    }
                }
                for l in 0..8 {
                    acc[l] = d.mul_add(sumi[l] as f32, acc[l]);
                }
            }
            let m = if fmt == QuantFormat::Q4K {
                let r = [acc_m[0] + acc_m[2], acc_m[1] + acc_m[3]];
                r[0] + r[1]
            } else {
                summs
            };
            hsum_float_8(acc) + m
        }
        QuantFormat::Q6K => {
            let mut acc = [0f32; 8];
            for (x, y) in w.chunks(bb).zip(a.chunks(292)) {
                let d = f32::from_le_bytes([y[0], y[1], y[2], y[3]]) * f16_at(x, 208);
                let scales: Vec<i32> = x[192..208].iter().map(|&v| i32::from(v as i8)).collect();
                let bsums: Vec<i32> = y[260..292]
                    .chunks(2)
                    .map(|b| i32::from(i16::from_le_bytes([b[0], b[1]])))
                    .collect();
                let mut sumi = [0i32; 8];
                for half in 0..2 {
                    let (ql, qh) = (&x[64 * half..], &x[128 + 32 * half..]);
                    for part in 0..4 {
                        // Elements 128·half + 32·part + l, as in the AVX2 loop.
                        let qx: Vec<i32> = (0..32)
                            .map(|l| {
                                let low = match part {
                                    0 => ql[l] & 0xF,
                                    1 => ql[32 + l] & 0xF,
                                    2 => ql[l] >> 4,
                                    _ => ql[32 + l] >> 4,
                                };
                                i32::from(low | (((qh[l] >> (2 * part)) & 3) << 4))
                            })
                            .collect();
                        let at = 4 + 128 * half + 32 * part;
                        let q = quads(&qx, &i8s(&y[at..at + 32]));
                        let is = 8 * half + 2 * part;
                        for l in 0..8 {
                            sumi[l] += scales[is + l / 4] * q[l];
                        }
                    }
                }
                for l in 0..8 {
                    let sub = bsums[2 * l] * scales[2 * l] + bsums[2 * l + 1] * scales[2 * l + 1];
                    acc[l] = d.mul_add((sumi[l] - (sub << 5)) as f32, acc[l]);
                }
            }
            hsum_float_8(acc)
        }
        _ => unreachable!("float formats are not quantized dots"),
    }
}

/// The repacked Q4_K kernels of `arch/x86/repack.cpp` for one weight row:
/// `gemm` (rows of a group of four, activations from the 4×8 quantizer)
/// accumulates per pair of sub-blocks, the gemv per super-block.
fn x86_q4_k_repacked(w: &[u8], a: &[u8], gemm: bool) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (x, y) in w.chunks(144).zip(a.chunks(292)) {
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let (cd, cm) = (f16_at(x, 0) * yd, f16_at(x, 2) * yd);
        let bsums: Vec<i32> = y[260..292]
            .chunks(2)
            .map(|b| i32::from(i16::from_le_bytes([b[0], b[1]])))
            .collect();
        let mut sums = [0i32; 8];
        let mut mins = [0i32; 8];
        for s in 0..8 {
            let (sc, m) = scale_min_k4(s, &x[4..16]);
            let dot: i32 = (0..32)
                .map(|l| {
                    let v = i32::from((x[16 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF);
                    v * i32::from(y[4 + 32 * s + l] as i8)
                })
                .sum();
            sums[s] = sc * dot;
            mins[s] = m * (bsums[2 * s] + bsums[2 * s + 1]);
        }
        if gemm {
            for p in 0..4 {
                acc = ((sums[2 * p] + sums[2 * p + 1]) as f32).mul_add(cd, acc);
                acc_min = ((mins[2 * p] + mins[2 * p + 1]) as f32).mul_add(cm, acc_min);
            }
        } else {
            acc = (sums.iter().sum::<i32>() as f32).mul_add(cd, acc);
            acc_min = (mins.iter().sum::<i32>() as f32).mul_add(cm, acc_min);
        }
    }
    acc - acc_min
}

/// `ggml_vec_dot_*_generic` (the reference C kernels), and `Σ |terms|` of
/// their float sum for an error bound.
fn generic_vec_dot(fmt: QuantFormat, w: &[u8], a: &[u8]) -> (f32, f64) {
    let bb = fmt.block_bytes();
    let mut sumf = 0f32;
    let mut magnitude = 0f64;
    let mut add = |v: f32| {
        magnitude += f64::from(v.abs());
        sumf += v;
    };
    match fmt {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 | QuantFormat::Mxfp4 => {
            for (x, y) in w.chunks(bb).zip(a.chunks(34)) {
                let codes: Vec<i32> = match fmt {
                    QuantFormat::Q8_0 => x[2..34].iter().map(|&v| i32::from(v as i8)).collect(),
                    QuantFormat::Q4_0 => nibbles(&x[2..18]).iter().map(|v| v - 8).collect(),
                    QuantFormat::Q5_0 => nibbles(&x[6..22])
                        .iter()
                        .enumerate()
                        .map(|(j, &v)| (v | if fifth_bit(&x[2..6], j) { 16 } else { 0 }) - 16)
                        .collect(),
                    _ => nibbles(&x[1..17])
                        .iter()
                        .map(|&v| KVALUES_MXFP4[v as usize])
                        .collect(),
                };
                let sumi: i32 = codes
                    .iter()
                    .zip(&y[2..34])
                    .map(|(&c, &q)| c * i32::from(q as i8))
                    .sum();
                let (xd, yd) = (f16_at(x, 0), f16_at(y, 0));
                add(match fmt {
                    QuantFormat::Q4_0 => sumi as f32 * xd * yd,
                    QuantFormat::Q5_0 => (xd * yd) * sumi as f32,
                    QuantFormat::Q8_0 => sumi as f32 * (xd * yd),
                    _ => (yd * e8m0_half(x[0])) * sumi as f32,
                });
            }
        }
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
            let qs_at = if fmt == QuantFormat::Q4_1 { 4 } else { 8 };
            for (x, y) in w.chunks(bb).zip(a.chunks(36)) {
                let sumi: i32 = nibbles(&x[qs_at..qs_at + 16])
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| {
                        let high = fmt == QuantFormat::Q5_1 && fifth_bit(&x[4..8], j);
                        (v | if high { 16 } else { 0 }) * i32::from(y[4 + j] as i8)
                    })
                    .sum();
                add((f16_at(x, 0) * f16_at(y, 0)) * sumi as f32 + f16_at(x, 2) * f16_at(y, 2));
            }
        }
        QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => {
            // One super-block at a time: Σ_s d·sc_s·dot_s − dmin·Σ m_s·S_s.
            for (x, y) in w.chunks(bb).zip(a.chunks(292)) {
                let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                let qa: Vec<i32> = y[4..260].iter().map(|&v| i32::from(v as i8)).collect();
                if fmt == QuantFormat::Q6K {
                    let code = |i: usize| {
                        let (h, part, l) = (i / 128, i % 128 / 32, i % 32);
                        let ql = &x[64 * h..];
                        let low = match part {
                            0 => ql[l] & 0xF,
                            1 => ql[32 + l] & 0xF,
                            2 => ql[l] >> 4,
                            _ => ql[32 + l] >> 4,
                        };
                        let high = (x[128 + 32 * h + l] >> (2 * part)) & 3;
                        i32::from(low | (high << 4)) - 32
                    };
                    let d = f16_at(x, 208) * yd;
                    for j in 0..16 {
                        let sc = i32::from(x[192 + j] as i8);
                        let dot: i32 = (16 * j..16 * j + 16).map(|i| code(i) * qa[i]).sum();
                        add(d * (sc * dot) as f32);
                    }
                } else {
                    let (d, dmin) = (f16_at(x, 0) * yd, f16_at(x, 2) * yd);
                    for s in 0..8 {
                        let (sc, m) = scale_min_k4(s, &x[4..16]);
                        let dot: i32 = (0..32)
                            .map(|l| {
                                let (qs, qh) = if fmt == QuantFormat::Q4K {
                                    (&x[16..144], None)
                                } else {
                                    (&x[48..176], Some(&x[16..48]))
                                };
                                let v = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
                                let h = qh.map_or(0, |qh| ((qh[l] >> s) & 1) << 4);
                                i32::from(v | h) * qa[32 * s + l]
                            })
                            .sum();
                        add(d * (sc * dot) as f32);
                        add(-dmin * (m * qa[32 * s..32 * s + 32].iter().sum::<i32>()) as f32);
                    }
                }
            }
        }
        _ => unreachable!(),
    }
    (sumf, magnitude)
}

const ROWS_REPACKED: usize = 40;
const ROWS_PLAIN: usize = 36;
const COLS: usize = 512;
const TOKENS: usize = 5;

fn backend(threads: usize) -> CpuDevice {
    CpuDevice::new(threads)
        .unwrap()
        .with_numerics(Numerics::LlamaCpp)
}

/// A stream fitted to everything `be` holds.
fn stream(be: &CpuDevice) -> CpuStream {
    be.stream(&Limits {
        max_tokens: TOKENS,
        max_keys: 16,
        max_head_dim: 16,
        max_experts: 0,
        ..Limits::default()
    })
    .unwrap()
}

fn matmul(be: &CpuDevice, t: &HostTensor, x: &[f32], n: usize) -> Vec<f32> {
    let w = be.upload_matrix(t).unwrap();
    let mut st = stream(be);
    let [rows, cols] = be.matrix_shape(&w);
    let mut xb = be.alloc(DType::F32, n * cols).unwrap();
    st.write(&mut xb, &x[..n * cols]).unwrap();
    let mut out = be.alloc(DType::F32, n * rows).unwrap();
    st.matmul(&w, &xb, n, &mut out).unwrap();
    let mut host = vec![0f32; n * rows];
    st.read(&out, &mut host).unwrap();
    host
}

const BLOCK_FORMATS: [QuantFormat; 9] = [
    QuantFormat::Q8_0,
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Mxfp4,
    QuantFormat::Q4K,
    QuantFormat::Q5K,
    QuantFormat::Q6K,
];

#[test]
fn quantized_matmul_matches_the_x86_kernels_bit_for_bit() {
    let (one, three) = (backend(1), backend(3));
    for fmt in BLOCK_FORMATS {
        for rows in [ROWS_REPACKED, ROWS_PLAIN] {
            let mut rng = Rng(0xd07 ^ u64::from(fmt.ggml_type()) ^ rows as u64);
            let t = random_matrix(fmt.name(), fmt, rows, COLS, &mut rng);
            let x = activations(TOKENS * COLS, &mut rng);
            let got = matmul(&one, &t, &x, TOKENS);
            assert_eq!(
                got,
                matmul(&three, &t, &x, TOKENS),
                "{fmt}: threads changed bits"
            );
            let rb = t.bytes.len() / rows;
            let repacked = fmt == QuantFormat::Q4K && rows % 8 == 0;
            for tok in 0..TOKENS {
                let xt = &x[tok * COLS..(tok + 1) * COLS];
                // llama.cpp's repacked Q4_K takes rows in fours (gemm) and
                // the remainder alone (gemv).
                let gemm = repacked && tok < TOKENS - TOKENS % 4;
                let a = match fmt {
                    QuantFormat::Q4_1 | QuantFormat::Q5_1 => x86_q8(xt, true),
                    QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K if gemm => {
                        x86_q8_k_4x8(xt)
                    }
                    QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => ref_q8_k(xt),
                    _ => x86_q8(xt, false),
                };
                for (r, w) in t.bytes.as_slice().chunks(rb).enumerate() {
                    let want = if repacked {
                        x86_q4_k_repacked(w, &a, gemm)
                    } else {
                        x86_vec_dot(fmt, w, &a)
                    };
                    let have = got[tok * rows + r];
                    assert_eq!(
                        have.to_bits(),
                        want.to_bits(),
                        "{fmt} [{rows} rows] token {tok} row {r}: {have} vs ggml {want}"
                    );
                    let (generic, magnitude) = generic_vec_dot(fmt, w, &a);
                    let bound =
                        2.0 * (COLS as f64 / 32.0 + 16.0) * f64::from(f32::EPSILON) * magnitude;
                    assert!(
                        (f64::from(have) - f64::from(generic)).abs() <= bound,
                        "{fmt} token {tok} row {r}: {have} vs generic {generic} (bound {bound:e})"
                    );
                }
            }
        }
    }
}

/// `ggml_vec_dot_f16` (AVX-512: four 16-lane accumulators over steps of
/// 64, folded, reduced, the rest added in f64) or tinyBLAS (one 16-lane
/// fused accumulator) on f16-valued operands.
fn ggml_f16_dot(w: &[f32], x: &[f32], tiny: bool) -> f32 {
    if tiny {
        let mut acc = [0f32; 16];
        for (i, (&a, &b)) in w.iter().zip(x).enumerate() {
            acc[i % 16] = a.mul_add(b, acc[i % 16]);
        }
        return reduce_add_ps_512(&acc);
    }
    let np = w.len() / 64 * 64;
    let mut sum = [[0f32; 16]; 4];
    for e in 0..np {
        let (j, l) = (e % 64 / 16, e % 16);
        sum[j][l] = w[e].mul_add(x[e], sum[j][l]);
    }
    let folded: Vec<f32> = (0..16)
        .map(|l| (sum[0][l] + sum[2][l]) + (sum[1][l] + sum[3][l]))
        .collect();
    let mut sumf = f64::from(reduce_add_ps_512(&folded));
    for e in np..w.len() {
        sumf += f64::from(w[e] * x[e]);
    }
    sumf as f32
}

#[test]
fn f16_matmul_follows_ggml_vec_dot_and_tinyblas() {
    let be = backend(2);
    let mut rng = Rng(21);
    // 80 inputs: one full step of 64 plus a tail for vec_dot; 80 % 16 = 0
    // lets tinyBLAS take the batch.
    let cols = 80;
    let t = random_matrix("f16", QuantFormat::F16, 8, cols, &mut rng);
    let x = activations(TOKENS * cols, &mut rng);
    let mut w = vec![0f32; 8 * cols];
    turbospark_core::quant::dequantize_row(QuantFormat::F16, t.bytes.as_slice(), &mut w).unwrap();
    for n in [1, TOKENS] {
        let got = matmul(&be, &t, &x, n);
        for tok in 0..n {
            let xt: Vec<f32> = x[tok * cols..(tok + 1) * cols]
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect();
            for r in 0..8 {
                let want = ggml_f16_dot(&w[r * cols..(r + 1) * cols], &xt, n > 1);
                assert_eq!(
                    got[tok * 8 + r].to_bits(),
                    want.to_bits(),
                    "n {n} token {tok} row {r}"
                );
            }
        }
    }
}

#[test]
fn float_matmuls_round_activations_like_ggml() {
    let be = backend(1);
    let mut rng = Rng(22);
    for fmt in [QuantFormat::F32, QuantFormat::Bf16] {
        let t = random_matrix(fmt.name(), fmt, 12, 64, &mut rng);
        let x = activations(TOKENS * 64, &mut rng);
        let mut w = vec![0f32; 12 * 64];
        turbospark_core::quant::dequantize_row(fmt, t.bytes.as_slice(), &mut w).unwrap();
        let got = matmul(&be, &t, &x, TOKENS);
        for tok in 0..TOKENS {
            for r in 0..12 {
                let (mut exact, mut magnitude) = (0f64, 0f64);
                for i in 0..64 {
                    let xv = x[tok * 64 + i];
                    let xv = if fmt == QuantFormat::Bf16 {
                        half::bf16::from_f32(xv).to_f32()
                    } else {
                        xv
                    };
                    exact += f64::from(w[r * 64 + i]) * f64::from(xv);
                    magnitude += (f64::from(w[r * 64 + i]) * f64::from(xv)).abs();
                }
                let have = f64::from(got[tok * 12 + r]);
                assert!(
                    (have - exact).abs() <= 16.0 * f64::from(f32::EPSILON) * magnitude,
                    "{fmt} token {tok} row {r}: {have} vs {exact}"
                );
            }
        }
    }
}

#[test]
fn kv_cache_holds_f16_values() {
    let be = backend(1);
    let mut st = stream(&be);
    let src: Vec<f32> = vec![1.0 / 3.0, 70000.0, -2.5e-8, 0.1];
    let mut s = be.alloc(DType::F32, 4).unwrap();
    st.write(&mut s, &src).unwrap();
    let mut cache = be.alloc(be.kv_dtype(), 8).unwrap();
    st.kv_write(&mut cache, &s, 1, 4, 1, 2).unwrap();
    let mut host = vec![0f32; 8];
    st.read(&cache, &mut host).unwrap();
    let want: Vec<f32> = src
        .iter()
        .map(|&v| half::f16::from_f32(v).to_f32())
        .collect();
    assert_eq!(&host[4..], &want[..]);
    assert_eq!(
        host[4 + 1],
        f32::INFINITY,
        "f16 overflows to infinity like ggml's cache"
    );
}

#[test]
fn exact_numerics_is_the_default() {
    let be = CpuDevice::new(1).unwrap();
    assert_eq!(be.numerics(), Numerics::Exact);
    let t = HostTensor {
        name: "w".into(),
        format: QuantFormat::F32,
        shape: vec![1, 2],
        bytes: SharedBytes::from_f32(&[1.0, 1.0]),
    };
    // Exact arithmetic keeps an f32 activation that f16 would round.
    assert_eq!(matmul(&be, &t, &[1.0 / 3.0, 0.0], 1), vec![1.0f32 / 3.0]);
}
