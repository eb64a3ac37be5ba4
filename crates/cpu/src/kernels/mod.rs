//! The CPU kernels of [`Numerics::Fast`](turbospark_backend::Numerics::Fast).
//!
//! Matmul, `out[t, o] = Σ_i W[o, i] · x[t, i]`: the activations are
//! quantized to 8 bits once per call ([`act`]) and each weight block is
//! dotted in integers against them ([`blocks`] gives the math per format).
//! Matrices outside expert banks are repacked at upload, eight rows
//! interleaved ([`packed`]), so that one SIMD lane carries one row and a
//! block costs one f32 multiply-add for eight rows; the rows past the last
//! whole group, experts, and formats without a packed kernel use kernels on
//! the original layout, one row against up to [`TOKENS`] tokens (prefill)
//! or four rows against one token (decode).
//!
//! One kernel set per instruction set — [`scalar`] (portable, and the
//! reference the others are tested against), `avx2*` (x86-64 with AVX2,
//! FMA and F16C: matmul on the original and on the packed layout,
//! attention, GLU, RMS norm) and `avx512_packed` (AVX-512 VNNI integer
//! dots for the packed 32-element formats, the AVX2 kernels elsewhere) —
//! chosen once when the device is built ([`Isa::detect`]).
//!
//! Work is split over the pool by output rows (whole groups of eight for a
//! packed matrix). A row's result does not depend on the thread count, the
//! split, or the other tokens of the batch: its integer block sums are
//! exact, and its f32 accumulation runs block by block in the same order
//! whatever the tile it is computed in.

pub(crate) mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_ops;
#[cfg(target_arch = "x86_64")]
mod avx2_packed;
#[cfg(target_arch = "x86_64")]
mod avx512_packed;
pub(crate) mod blocks;
mod packed;
mod scalar;

use crate::disjoint::DisjointMut;
use crate::types::CpuMatrix;
pub(crate) use act::{ActRows, ActScratch};
pub(crate) use packed::Packed;

/// Activation rows dotted against one unpacked weight block.
pub(crate) const TOKENS: usize = 4;

/// Weight rows a thread walks through before moving to the next tokens.
const ROW_CHUNK: usize = 32;

/// The instruction set the fast kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust.
    Scalar,
    /// x86-64 AVX2, FMA and F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512F, AVX-512VL, AVX-512BW and AVX-512 VNNI
    /// (integer dots of packed weights by `vpdpbusd`, sixteen rows at a
    /// time in 512-bit registers where two groups of eight are at hand;
    /// same bits as [`Isa::Avx2`]).
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU has.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            return Isa::Avx2;
        }
        Isa::Scalar
    }

    /// `isa` if this CPU can run it, else the best it has below `isa`.
    pub fn supported(self) -> Isa {
        match (self, Isa::detect()) {
            (Isa::Scalar, _) => Isa::Scalar,
            (Isa::Avx2, Isa::Avx512Vnni) => Isa::Avx2,
            (_, best) => best,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
        }
    }

    /// Whether the AVX2 kernels run on this instruction set.
    pub(crate) fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni)
    }

    /// `out[r · c_n + c] = Σ_i W[row0 + r, i] · x_{t0+c}[i]` for a tile of
    /// [`tile_rows`] (`r < rows.len()`, `c < c_n`, `out` is `rows · c_n`).
    #[inline]
    fn dot_tile(
        self,
        w: &CpuMatrix,
        rows: &[&[u8]],
        acts: ActRows<'_>,
        t0: usize,
        out: &mut [f32],
    ) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an `Isa::Avx2` or `Isa::Avx512Vnni` only exists after
            // `detect` found the features (`supported` never upgrades); the
            // rows and activations have the matrix's width and format.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe {
                avx2::dot_tile(w.format, rows, w.cols, acts, t0, out)
            },
            _ => scalar::dot_tile(w.format, rows, w.cols, acts, t0, out),
        }
    }
}

/// Weight rows per tile for `c` activation rows: eight rows against one
/// token (decode: eight independent sums per activation load), one row
/// against up to [`TOKENS`] tokens (prefill: one unpack per four tokens;
/// two rows at a time measured slower, from register pressure).
pub(crate) const fn tile_rows(c: usize) -> usize {
    if c == 1 {
        8
    } else {
        1
    }
}

/// `gate[i] = act(gate[i]) · up[i]` on `isa`.
pub(crate) fn glu(isa: Isa, gate: &mut [f32], up: &[f32], act: turbospark_core::arch::Activation) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: these instruction sets only exist on CPUs with AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { avx2_ops::glu(gate, up, act) },
        _ => crate::elementwise::glu(gate, up, act),
    }
}

/// RMS norm of every `dim`-wide row of `x` on `isa`.
pub(crate) fn rms_norm(
    isa: Isa,
    x: &mut [f32],
    dim: usize,
    spec: turbospark_core::arch::NormSpec,
    weight: Option<&[f32]>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: these instruction sets only exist on CPUs with AVX2 and FMA.
        Isa::Avx2 | Isa::Avx512Vnni => unsafe { avx2_ops::rms_norm(x, dim, spec, weight) },
        _ => crate::elementwise::rms_norm(x, dim, spec, weight),
    }
}

/// Attends query head `h` of token `t` on `isa` (inputs checked as for
/// [`AttentionInputs::attend`](crate::attention::AttentionInputs::attend)).
pub(crate) fn attend(
    isa: Isa,
    inputs: &crate::attention::AttentionInputs<'_>,
    t: usize,
    h: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: these instruction sets only exist on CPUs with AVX2 and
        // FMA; the backend checked the buffers; the head width is a
        // multiple of 8.
        Isa::Avx2 | Isa::Avx512Vnni if inputs.params.head_dim.is_multiple_of(8) => unsafe {
            avx2_ops::attend(inputs, t, h, scores, out)
        },
        _ => inputs.attend(t, h, scores, out),
    }
}

/// Whether `isa` has kernels for repacked weights.
pub(crate) fn packs(isa: Isa) -> bool {
    isa.has_avx2()
}

/// The repacked form of `w` the kernels of `isa` use, if any.
pub(crate) fn pack(isa: Isa, w: &CpuMatrix) -> Option<Packed> {
    if !packs(isa) {
        return None;
    }
    let mut p = Packed::for_shape(w.format, w.rows, w.cols)?;
    p.fill(w.format, |r| w.row(r));
    Some(p)
}

/// Refills `w`'s packing from its (new) bytes, in place when nothing else
/// shares it.
pub(crate) fn repack(isa: Isa, w: &mut CpuMatrix) {
    match w.packed.as_mut() {
        Some(p) => {
            let p = std::sync::Arc::make_mut(p);
            let (format, bytes, rb) = (w.format, w.bytes.as_slice(), w.row_bytes);
            p.fill(format, |r| &bytes[r * rb..(r + 1) * rb]);
        }
        None => w.packed = pack(isa, w).map(std::sync::Arc::new),
    }
}

/// Rows per unit of work: a packed matrix is split between threads in
/// whole groups, in pairs of groups where `isa` computes two at a time.
pub(crate) fn row_unit(isa: Isa, w: &CpuMatrix) -> usize {
    match (&w.packed, isa) {
        (Some(_), Isa::Avx512Vnni) if act::ActKind::of(w.format) == act::ActKind::Q32 => {
            2 * packed::GROUP
        }
        (Some(_), _) => packed::GROUP,
        (None, _) => 1,
    }
}

/// Query heads attended together (sharing each key and value load) by
/// [`attend_heads`].
pub(crate) const HEADS_PER_ITEM: usize = 4;

/// Whether [`attend_heads`] has a kernel on `isa` for these parameters:
/// heads whose width is a multiple of 8.
pub(crate) fn heads_kernel(isa: Isa, p: &turbospark_backend::AttentionParams) -> bool {
    isa.has_avx2() && p.head_dim.is_multiple_of(8)
}

/// Whether one attention call over these parameters attends
/// [`HEADS_PER_ITEM`] heads per item with [`attend_heads`]: batches
/// (prefill). A single token keeps one head per item, which splits better
/// between threads.
pub(crate) fn attends_heads(isa: Isa, p: &turbospark_backend::AttentionParams) -> bool {
    heads_kernel(isa, p) && p.n_tokens > 1
}

/// Whether a call over several sequences' parts (many items to share
/// between threads whatever each part's size) attends grouped query heads
/// with [`attend_heads`]: where the kernel runs and query heads share KV
/// heads.
pub(crate) fn attends_heads_in_parts(isa: Isa, p: &turbospark_backend::AttentionParams) -> bool {
    heads_kernel(isa, p) && p.n_heads > p.n_kv_heads
}

/// Query heads `h0 .. h0 + g` (`g ≤` [`HEADS_PER_ITEM`], one KV head) of
/// token `t` (each head's bits are [`attend`]'s); `scores` holds `g` times
/// the token's key count.
pub(crate) fn attend_heads(
    isa: Isa,
    inputs: &crate::attention::AttentionInputs<'_>,
    t: usize,
    h0: usize,
    g: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if heads_kernel(isa, inputs.params) {
        // SAFETY: `heads_kernel` checked the CPU features and the head
        // width; the caller checked the buffers and the head group.
        unsafe { avx2_ops::attend_heads(inputs, t, h0, g, scores, out) };
        return;
    }
    let hd = inputs.params.head_dim;
    for (i, o) in out.chunks_exact_mut(hd).take(g).enumerate() {
        attend(isa, inputs, t, h0 + i, scores, o);
    }
}

/// Computes output rows `rows` of `w` for `n` tokens whose activations are
/// `acts` into `out` (`[n, w.rows]`).
///
/// # Safety
/// Concurrent callers sharing `out` must pass disjoint `rows`.
pub(crate) unsafe fn matmul_rows(
    isa: Isa,
    w: &CpuMatrix,
    acts: ActRows<'_>,
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
) {
    let mut rows = rows;
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(p)) = (isa.has_avx2(), w.packed.as_deref()) {
        if rows.start.is_multiple_of(packed::GROUP) {
            let g_end = (rows.end / packed::GROUP).min(p.groups);
            let g_start = rows.start / packed::GROUP;
            if g_start < g_end {
                // SAFETY: forwarded; the groups lie in this caller's rows.
                unsafe { packed_groups(isa, w, p, acts, n, out, g_start..g_end) };
                rows.start = g_end * packed::GROUP;
            }
        }
    }
    let mut tile = [0f32; 8];
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + ROW_CHUNK).min(rows.end);
        let mut t = 0;
        while t < n {
            let c = TOKENS.min(n - t);
            let mut r = r0;
            while r < r1 {
                let nr = if r + tile_rows(c) <= r1 {
                    tile_rows(c)
                } else {
                    1
                };
                let mut wrows: [&[u8]; 8] = [&[]; 8];
                for (i, wr) in wrows.iter_mut().enumerate().take(nr) {
                    *wr = w.row(r + i);
                }
                let tile = &mut tile[..nr * c];
                isa.dot_tile(w, &wrows[..nr], acts, t, tile);
                for i in 0..nr {
                    for j in 0..c {
                        // SAFETY: row `r + i` lies in this caller's `rows`,
                        // which the contract keeps disjoint.
                        unsafe { out.range((t + j) * w.rows + r + i, 1)[0] = tile[i * c + j] };
                    }
                }
                r += nr;
            }
            t += c;
        }
        r0 = r1;
    }
}

/// Groups of a packed matrix chunk by chunk, [`TOKENS`] tokens at a time
/// (the AVX-512 VNNI kernel's [`avx512_packed::TILE_TOKENS`] where it
/// runs; [`avx512_packed::PAIR_TILE_TOKENS`] on two groups at a time,
/// where the chunk has two left).
///
/// # Safety
/// The CPU has the features of `isa`, at least AVX2, FMA and F16C;
/// concurrent callers sharing `out` pass disjoint groups.
#[cfg(target_arch = "x86_64")]
unsafe fn packed_groups(
    isa: Isa,
    w: &CpuMatrix,
    p: &Packed,
    acts: ActRows<'_>,
    n: usize,
    out: &DisjointMut<'_>,
    groups: std::ops::Range<usize>,
) {
    const GROUP_CHUNK: usize = 4;
    let vnni = isa == Isa::Avx512Vnni && matches!(acts, ActRows::Q32(_));
    let tile_tokens = if vnni {
        avx512_packed::TILE_TOKENS
    } else {
        TOKENS
    };
    let mut tile = [[0f32; packed::GROUP]; avx512_packed::TILE_TOKENS];
    let mut pair_tile = [[0f32; 2 * packed::GROUP]; avx512_packed::PAIR_TILE_TOKENS];
    let mut g0 = groups.start;
    while g0 < groups.end {
        let g1 = (g0 + GROUP_CHUNK).min(groups.end);
        let mut g_single = g0;
        // Two groups at a time in 512-bit registers where VNNI runs.
        if let (true, ActRows::Q32(a)) = (vnni, acts) {
            g_single = g0 + (g1 - g0) / 2 * 2;
            let mut t = 0;
            while t < n {
                let c = avx512_packed::PAIR_TILE_TOKENS.min(n - t);
                let tile = &mut pair_tile[..c];
                for g in (g0..g_single).step_by(2) {
                    // SAFETY: the CPU has the features (contract); groups
                    // `g` and `g + 1` are whole; the activations hold `n`
                    // rows of `p.blocks` blocks.
                    unsafe {
                        let (grp0, grp1) = (p.group(w.format, g), p.group(w.format, g + 1));
                        avx512_packed::group_pair_tile(w.format, grp0, grp1, p.blocks, a, t, tile);
                    }
                    for (j, vals) in tile.iter().enumerate() {
                        // SAFETY: both groups' rows lie in this caller's range.
                        let o = unsafe {
                            out.range((t + j) * w.rows + g * packed::GROUP, 2 * packed::GROUP)
                        };
                        o.copy_from_slice(vals);
                    }
                }
                t += c;
            }
        }
        let mut t = 0;
        while t < n && g_single < g1 {
            let c = tile_tokens.min(n - t);
            for g in g_single..g1 {
                // SAFETY: the CPU has the features (contract); group `g` is
                // whole; the activations hold `n` rows of `p.blocks` blocks.
                let grp = p.group(w.format, g);
                let tile = &mut tile[..c];
                // SAFETY: as above; the activation shape is the format's.
                unsafe {
                    match acts {
                        ActRows::Q32(a) if vnni => {
                            avx512_packed::group_tile(w.format, grp, p.blocks, a, t, tile)
                        }
                        ActRows::Q32(a) => {
                            avx2_packed::group_tile(w.format, grp, p.blocks, a, t, tile)
                        }
                        ActRows::Q256(a) => {
                            avx2_packed::kgroup_tile(w.format, grp, p.blocks, a, t, tile)
                        }
                        ActRows::F32(_) => unreachable!("float weights are not repacked"),
                    }
                }
                for (j, vals) in tile[..c].iter().enumerate() {
                    // SAFETY: group `g`'s rows lie in this caller's range.
                    let o =
                        unsafe { out.range((t + j) * w.rows + g * packed::GROUP, packed::GROUP) };
                    o.copy_from_slice(vals);
                }
            }
            t += c;
        }
        g0 = g1;
    }
}

#[cfg(test)]
mod tests {
    use super::act::{quantize_256, quantize_32, Block256, Block32};
    use super::*;
    use turbospark_backend::SharedBytes;
    use turbospark_core::quant::dequantize_row;
    use turbospark_core::QuantFormat;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s >> 11
        }
    }

    /// A random `[rows, cols]` matrix of `format` with finite, moderate scales.
    fn matrix(format: QuantFormat, rows: usize, cols: usize, seed: u64) -> CpuMatrix {
        let mut next = rng(seed);
        let rb = turbospark_core::quant::row_bytes(format, cols).unwrap();
        let mut bytes: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
        let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
        match format {
            QuantFormat::F32 => {
                for c in bytes.chunks_exact_mut(4) {
                    let v = (next() % 2001) as f32 / 1000.0 - 1.0;
                    c.copy_from_slice(&v.to_le_bytes());
                }
            }
            QuantFormat::F16 => {
                for c in bytes.chunks_exact_mut(2) {
                    c.copy_from_slice(&half((next() % 2001) as f32 / 1000.0 - 1.0));
                }
            }
            QuantFormat::Bf16 => {
                for c in bytes.chunks_exact_mut(2) {
                    let v = (next() % 2001) as f32 / 1000.0 - 1.0;
                    c.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
                }
            }
            _ => {
                for blk in bytes.chunks_exact_mut(format.block_bytes()) {
                    let v = 0.002 + (next() % 100) as f32 * 1e-4;
                    match format {
                        QuantFormat::Q6K => blk[208..210].copy_from_slice(&half(v)),
                        QuantFormat::Mxfp4 => {
                            blk[0] = [118, 120, 121, 123, 125, 127, 128, 130][(next() % 8) as usize]
                        }
                        QuantFormat::Q4_1
                        | QuantFormat::Q5_1
                        | QuantFormat::Q4K
                        | QuantFormat::Q5K => {
                            blk[0..2].copy_from_slice(&half(v));
                            blk[2..4].copy_from_slice(&half(-v * 0.7));
                        }
                        _ => blk[0..2].copy_from_slice(&half(v)),
                    }
                }
            }
        }
        CpuMatrix {
            name: format!("w.{format}"),
            format,
            rows,
            cols,
            row_bytes: rb,
            bytes: SharedBytes::from_vec(bytes),
            packed: None,
        }
    }

    /// The activations the kernels see, dequantized again.
    fn seen_activations(format: QuantFormat, x: &[f32]) -> Vec<f32> {
        match act::ActKind::of(format) {
            act::ActKind::F32 => x.to_vec(),
            act::ActKind::Q32 => {
                let mut q = vec![Block32::ZERO; x.len() / 32];
                quantize_32(x, &mut q);
                q.iter()
                    .flat_map(|b| b.qs.map(|v| b.d * v as f32))
                    .collect()
            }
            act::ActKind::Q256 => {
                let mut q = vec![Block256::ZERO; x.len() / 256];
                quantize_256(x, &mut q);
                q.iter()
                    .flat_map(|b| b.qs.map(|v| b.d * v as f32))
                    .collect()
            }
        }
    }

    /// Every format, every instruction set this CPU has, awkward row and
    /// token counts: the kernels against an f64 dot of the dequantized
    /// weights and the dequantized 8-bit activations.
    #[test]
    fn kernels_match_the_dequantized_reference() {
        let isas: Vec<Isa> = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| i.supported() == *i)
            .collect();
        for format in QuantFormat::ALL {
            let cols = if format.block_elems() == 256 {
                512
            } else {
                96 + 32 * 3
            };
            for (rows, n) in [
                (1, 1),
                (7, 3),
                (13, 6),
                (33, 9),
                (40, 1),
                (27, 5),
                (24, 17),
                (64, 16),
            ] {
                let w = matrix(format, rows, cols, rows as u64 * 31 + n as u64);
                let mut next = rng(n as u64);
                let x: Vec<f32> = (0..n * cols)
                    .map(|_| ((next() % 20001) as f32 / 10000.0 - 1.0) * 1.5)
                    .collect();
                let seen = seen_activations(format, &x);
                let mut wrow = vec![0f32; cols];
                let mut want = vec![0f64; n * rows];
                let mut scale = vec![0f64; n * rows];
                for r in 0..rows {
                    dequantize_row(format, w.row(r), &mut wrow).unwrap();
                    for t in 0..n {
                        let xt = &seen[t * cols..(t + 1) * cols];
                        want[t * rows + r] = wrow
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum();
                        scale[t * rows + r] = wrow
                            .iter()
                            .zip(xt)
                            .map(|(&a, &b)| (a as f64 * b as f64).abs())
                            .sum();
                    }
                }
                let mut simd_bits: Option<Vec<u32>> = None;
                for &isa in &isas {
                    let mut acts = ActScratch::default();
                    acts.fit_matrix(cols);
                    acts.fit_tokens(n);
                    let mut w = w.clone();
                    w.packed = pack(isa, &w).map(std::sync::Arc::new);
                    let mut got = vec![0f32; n * rows];
                    let out = DisjointMut::new(&mut got);
                    // Ragged split: rows in two uneven parts (whole groups
                    // when packed).
                    let cut = rows / 3 / row_unit(isa, &w) * row_unit(isa, &w);
                    let a = acts.quantize(isa, format, &x).unwrap();
                    // SAFETY: the two row ranges are disjoint.
                    unsafe {
                        matmul_rows(isa, &w, a, n, &out, 0..cut);
                        matmul_rows(isa, &w, a, n, &out, cut..rows);
                    }
                    // Each token alone gives the bits it had in the batch.
                    for t in 0..n {
                        let mut alone = vec![0f32; rows];
                        let out = DisjointMut::new(&mut alone);
                        let a = acts
                            .quantize(isa, format, &x[t * cols..(t + 1) * cols])
                            .unwrap();
                        // SAFETY: one caller.
                        unsafe { matmul_rows(isa, &w, a, 1, &out, 0..rows) };
                        assert!(
                            alone
                                .iter()
                                .zip(&got[t * rows..(t + 1) * rows])
                                .all(|(p, q)| p.to_bits() == q.to_bits()),
                            "{format} {} rows={rows} n={n}: token {t} alone differs",
                            isa.name()
                        );
                    }
                    // The SIMD instruction sets agree bit for bit.
                    if isa.has_avx2() {
                        let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                        match &simd_bits {
                            Some(b) => assert!(
                                *b == bits,
                                "{format} {} rows={rows} n={n}: differs from avx2",
                                isa.name()
                            ),
                            None => simd_bits = Some(bits),
                        }
                    }
                    for i in 0..n * rows {
                        let err = (got[i] as f64 - want[i]).abs();
                        assert!(
                            err <= 2e-6 * scale[i] + 1e-6,
                            "{format} {} rows={rows} n={n} out {i}: {} vs {} (scale {})",
                            isa.name(),
                            got[i],
                            want[i],
                            scale[i]
                        );
                    }
                }
            }
        }
    }
}
