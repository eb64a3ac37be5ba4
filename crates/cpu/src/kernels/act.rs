//! 8-bit activations for the fast matmul: each row of f32 activations is
//! quantized once per matmul into the block shape the weight's kernel
//! consumes, with f32 scales (ggml stores the Q8_0 scale as f16; keeping it
//! f32 makes this mode slightly more faithful than llama.cpp's).
//!
//! ```text
//! Block32   (for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 weights), per 32 values x:
//!           d = max|x| / 127,  q_j = round_half_even(x_j / d) ∈ [-127, 127]
//!           s = d · Σ q_j      (carries a weight block's offset or min)
//!           sum = 128 · Σ q_j  (integer; offsets Q8_0 weights made unsigned)
//! Block256  (for Q4_K, Q5_K, Q6_K weights), per 256 values:
//!           d, q as above over the 256 values; bsums[k] = Σ of codes 16k .. 16k+15
//! ```
//!
//! An all-zero block gets `d = 0` and zero codes. The scalar quantizers
//! here are the reference; the AVX2 ones (`avx2_ops`, used on every x86
//! instruction set with SIMD kernels) give the same blocks bit for bit, so
//! the integer sums of the kernels agree across instruction sets; only the
//! order of the f32 sums differs.

use super::Isa;
use crate::disjoint::DisjointMut;
use crate::pool::split;
use turbospark_core::QuantFormat;

/// Values per [`Block32`].
pub(crate) const QK32: usize = 32;
/// Values per [`Block256`].
pub(crate) const QK256: usize = 256;

/// 32 activations as 8-bit codes with an f32 scale and the scaled code sum.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub(crate) struct Block32 {
    pub d: f32,
    /// `d · Σ qs`.
    pub s: f32,
    /// `128 · Σ qs`: what codes `w + 128` dot more than codes `w`.
    pub sum128: i32,
    pub qs: [i8; QK32],
}

impl Block32 {
    pub(crate) const ZERO: Block32 = Block32 {
        d: 0.0,
        s: 0.0,
        sum128: 0,
        qs: [0; QK32],
    };
}

/// 256 activations as 8-bit codes with an f32 scale and the sum of each
/// group of 16 codes.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub(crate) struct Block256 {
    pub d: f32,
    pub bsums: [i16; QK256 / 16],
    pub qs: [i8; QK256],
}

impl Block256 {
    pub(crate) const ZERO: Block256 = Block256 {
        d: 0.0,
        bsums: [0; QK256 / 16],
        qs: [0; QK256],
    };
}

/// The activation shape a weight format's fast kernel takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActKind {
    /// f32 as given (float weights).
    F32,
    /// [`Block32`] rows.
    Q32,
    /// [`Block256`] rows.
    Q256,
}

impl ActKind {
    pub(crate) const fn of(format: QuantFormat) -> ActKind {
        match format {
            QuantFormat::F32 | QuantFormat::F16 | QuantFormat::Bf16 => ActKind::F32,
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => ActKind::Q256,
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Mxfp4 => ActKind::Q32,
        }
    }
}

/// `x / d` rounded half to even. Adding and subtracting 1.5 · 2^23 rounds
/// an f32 of magnitude below 2^22 to an integer in the current rounding
/// mode (to nearest, ties to even) without a libm call, so the loop
/// vectorises on every instruction set.
#[inline]
fn code(x: f32, id: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let v = (x * id).clamp(-127.0, 127.0);
    ((v + MAGIC) - MAGIC) as i8
}

/// `(d, 1/d)` for a block whose largest magnitude is `amax`.
#[inline]
pub(super) fn scales(amax: f32) -> (f32, f32) {
    if amax > 0.0 {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    }
}

/// `max |x|` in eight lanes (vectorisable).
#[inline]
fn amax(x: &[f32]) -> f32 {
    let mut m = [0f32; 8];
    for c in x.chunks_exact(8) {
        for l in 0..8 {
            m[l] = m[l].max(c[l].abs());
        }
    }
    let tail = x.chunks_exact(8).remainder();
    tail.iter().chain(&m).fold(0f32, |a, v| a.max(v.abs()))
}

/// Quantizes `x` (a multiple of 32 long) into `out`.
pub(crate) fn quantize_32(x: &[f32], out: &mut [Block32]) {
    for (xb, b) in x.chunks_exact(QK32).zip(out.iter_mut()) {
        let amax = amax(xb);
        let (d, id) = scales(amax);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = code(v, id);
            sum += *q as i32;
        }
        b.d = d;
        b.s = d * sum as f32;
        b.sum128 = 128 * sum;
    }
}

/// Quantizes `x` (a multiple of 256 long) into `out`.
pub(crate) fn quantize_256(x: &[f32], out: &mut [Block256]) {
    for (xb, b) in x.chunks_exact(QK256).zip(out.iter_mut()) {
        let amax = amax(xb);
        let (d, id) = scales(amax);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = code(v, id);
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        b.d = d;
    }
}

/// [`quantize_32`] on `isa` (the same blocks on every instruction set).
fn quantizer_32(isa: Isa) -> fn(&[f32], &mut [Block32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => |x, out| {
            // SAFETY: these instruction sets only exist on CPUs with AVX2
            // and FMA.
            unsafe { super::avx2_ops::quantize_32(x, out) }
        },
        _ => quantize_32,
    }
}

/// [`quantize_256`] on `isa` (the same blocks on every instruction set).
fn quantizer_256(isa: Isa) -> fn(&[f32], &mut [Block256]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => |x, out| {
            // SAFETY: these instruction sets only exist on CPUs with AVX2
            // and FMA.
            unsafe { super::avx2_ops::quantize_256(x, out) }
        },
        _ => quantize_256,
    }
}

/// Activation rows of one matmul, quantized for its weight's kernel.
#[derive(Clone, Copy)]
pub(crate) enum ActRows<'a> {
    F32(&'a [f32]),
    Q32(&'a [Block32]),
    Q256(&'a [Block256]),
}

/// Storage for quantized activations, sized once: for calls of up to
/// `tokens` rows of up to `cols` inputs.
#[derive(Default)]
pub(crate) struct ActScratch {
    tokens: usize,
    cols: usize,
    q32: Vec<Block32>,
    q256: Vec<Block256>,
}

impl ActScratch {
    /// Grows the scratch for matrices of `cols` inputs.
    pub(crate) fn fit_matrix(&mut self, cols: usize) {
        self.cols = self.cols.max(cols);
        self.resize();
    }

    /// Grows the scratch for calls of up to `tokens` rows.
    pub(crate) fn fit_tokens(&mut self, tokens: usize) {
        self.tokens = self.tokens.max(tokens);
        self.resize();
    }

    fn resize(&mut self) {
        let elements = self.tokens * self.cols;
        let (n32, n256) = (elements.div_ceil(QK32), elements.div_ceil(QK256));
        if self.q32.len() < n32 {
            self.q32.resize(n32, Block32::ZERO);
        }
        if self.q256.len() < n256 {
            self.q256.resize(n256, Block256::ZERO);
        }
    }

    /// Elements the scratch holds in either shape.
    pub(crate) fn capacity(&self) -> usize {
        (self.q32.len() * QK32).min(self.q256.len() * QK256)
    }

    /// Quantizes `x` for a weight of `format` on `isa`; `None` when `x` is
    /// longer than the scratch or not a whole number of blocks.
    pub(crate) fn quantize<'a>(
        &'a mut self,
        isa: Isa,
        format: QuantFormat,
        x: &'a [f32],
    ) -> Option<ActRows<'a>> {
        match ActKind::of(format) {
            ActKind::F32 => Some(ActRows::F32(x)),
            ActKind::Q32 => {
                let out = self.q32.get_mut(..x.len() / QK32)?;
                x.len().is_multiple_of(QK32).then_some(())?;
                quantizer_32(isa)(x, out);
                Some(ActRows::Q32(out))
            }
            ActKind::Q256 => {
                let out = self.q256.get_mut(..x.len() / QK256)?;
                x.len().is_multiple_of(QK256).then_some(())?;
                quantizer_256(isa)(x, out);
                Some(ActRows::Q256(out))
            }
        }
    }
}

impl ActScratch {
    /// [`ActScratch::quantize`] with the blocks split between the shares
    /// of `run` (which calls its argument with `(share, shares)` for every
    /// share, possibly on several threads). Blocks are quantized on their
    /// own, so the codes are the same whatever the split.
    pub(crate) fn quantize_split<'a>(
        &'a mut self,
        isa: Isa,
        format: QuantFormat,
        x: &'a [f32],
        run: impl FnOnce(&(dyn Fn(usize, usize) + Sync)),
    ) -> Option<ActRows<'a>> {
        fn split_blocks<B: Send>(
            x: &[f32],
            out: &mut [B],
            block: usize,
            quantize: fn(&[f32], &mut [B]),
            run: impl FnOnce(&(dyn Fn(usize, usize) + Sync)),
        ) {
            let n = out.len();
            let out = DisjointMut::new(out);
            run(&|share, shares| {
                let r = split(n, shares, share);
                // SAFETY: `split` gives every share a disjoint block range.
                let o = unsafe { out.range(r.start, r.len()) };
                quantize(&x[r.start * block..r.end * block], o);
            });
        }
        match ActKind::of(format) {
            ActKind::F32 => Some(ActRows::F32(x)),
            ActKind::Q32 => {
                let out = self.q32.get_mut(..x.len() / QK32)?;
                x.len().is_multiple_of(QK32).then_some(())?;
                split_blocks(x, out, QK32, quantizer_32(isa), run);
                Some(ActRows::Q32(out))
            }
            ActKind::Q256 => {
                let out = self.q256.get_mut(..x.len() / QK256)?;
                x.len().is_multiple_of(QK256).then_some(())?;
                split_blocks(x, out, QK256, quantizer_256(isa), run);
                Some(ActRows::Q256(out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_quantization_gives_the_same_blocks() {
        let x: Vec<f32> = (0..32 * 256)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.01)
            .collect();
        for format in [QuantFormat::Q4_1, QuantFormat::Q4K] {
            let mut whole = ActScratch::default();
            whole.fit_matrix(x.len());
            whole.fit_tokens(1);
            let mut parts = ActScratch::default();
            parts.fit_matrix(x.len());
            parts.fit_tokens(1);
            let a = whole.quantize(Isa::Scalar, format, &x).unwrap();
            let b = parts
                .quantize_split(Isa::Scalar, format, &x, |f| (0..3).for_each(|i| f(i, 3)))
                .unwrap();
            match (a, b) {
                (ActRows::Q32(a), ActRows::Q32(b)) => assert!(a == b),
                (ActRows::Q256(a), ActRows::Q256(b)) => assert!(a == b),
                _ => panic!("another activation kind for {format:?}"),
            }
        }
    }

    #[test]
    fn codes_reconstruct_within_half_a_step() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut b32 = vec![Block32::ZERO; 16];
        quantize_32(&x, &mut b32);
        for (xb, b) in x.chunks(32).zip(&b32) {
            let mut sum = 0i32;
            for (&v, &q) in xb.iter().zip(&b.qs) {
                assert!((v - b.d * q as f32).abs() <= b.d * 0.5 + 1e-7);
                sum += q as i32;
            }
            assert_eq!(b.s, b.d * sum as f32);
            assert_eq!(b.sum128, 128 * sum);
        }
        let mut b256 = vec![Block256::ZERO; 2];
        quantize_256(&x, &mut b256);
        for (xb, b) in x.chunks(256).zip(&b256) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(b.d, amax / 127.0);
            for k in 0..16 {
                let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i32).sum();
                assert_eq!(b.bsums[k] as i32, s);
            }
        }
    }

    /// Every instruction set's quantizers give the scalar ones' blocks bit
    /// for bit, ties, zero blocks, signed zeros, infinities and NaNs
    /// included.
    #[test]
    fn quantizers_agree_across_instruction_sets() {
        let mut x: Vec<f32> = (0..256 * 6)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * 0.0137)
            .collect();
        // Block 1: values whose scaled codes land on halves (ties).
        for (j, v) in x[32..64].iter_mut().enumerate() {
            *v = (j as f32 - 16.0) + 0.5;
        }
        x[32] = 127.0;
        // Block 2: zeros, one of them negative; block 3: a NaN; block 4:
        // an infinity; block 5 (and the second 256-block): tiny values.
        x[64..96].iter_mut().for_each(|v| *v = 0.0);
        x[70] = -0.0;
        x[100] = f32::NAN;
        x[140] = f32::INFINITY;
        x[141] = f32::NEG_INFINITY;
        x[160..192].iter_mut().for_each(|v| *v *= 1e-30);
        x[300] = f32::NAN;
        x[600] = -f32::INFINITY;
        x[800..1056].iter_mut().for_each(|v| *v = 0.0);
        let want32 = {
            let mut q = vec![Block32::ZERO; x.len() / QK32];
            quantize_32(&x, &mut q);
            q
        };
        let want256 = {
            let mut q = vec![Block256::ZERO; x.len() / QK256];
            quantize_256(&x, &mut q);
            q
        };
        let bits32 = |q: &[Block32]| -> Vec<(u32, u32, i32, [i8; QK32])> {
            q.iter()
                .map(|b| (b.d.to_bits(), b.s.to_bits(), b.sum128, b.qs))
                .collect()
        };
        for isa in [Isa::Avx2, Isa::Avx512Vnni] {
            if isa.supported() != isa {
                continue;
            }
            let mut q = vec![Block32::ZERO; x.len() / QK32];
            quantizer_32(isa)(&x, &mut q);
            assert_eq!(bits32(&q), bits32(&want32), "{}", isa.name());
            let mut q = vec![Block256::ZERO; x.len() / QK256];
            quantizer_256(isa)(&x, &mut q);
            for (a, b) in q.iter().zip(&want256) {
                assert_eq!(a.d.to_bits(), b.d.to_bits(), "{}", isa.name());
                assert_eq!(a.bsums, b.bsums, "{}", isa.name());
                assert_eq!(a.qs, b.qs, "{}", isa.name());
            }
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let mut b = [Block32::ZERO; 1];
        quantize_32(&[0.0; 32], &mut b);
        assert_eq!(b[0], Block32::ZERO);
    }
}
