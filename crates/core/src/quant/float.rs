//! Plain float rows: f32, f16 (IEEE binary16) and bf16 (the high half of an
//! f32), all little-endian. Widening to f32 is exact; bf16 is widened by the
//! 16-bit shift ggml's `GGML_BF16_TO_FP32` uses, so NaN payloads pass through.

fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

fn bf16_at(b: &[u8]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
}

fn dequantize_with(bytes: &[u8], out: &mut [f32], width: usize, read: fn(&[u8]) -> f32) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(width)) {
        *o = read(b);
    }
}

fn dot_with(bytes: &[u8], x: &[f32], width: usize, read: fn(&[u8]) -> f32) -> f64 {
    x.iter()
        .zip(bytes.chunks_exact(width))
        .map(|(&xv, b)| f64::from(read(b)) * f64::from(xv))
        .sum()
}

pub(super) fn dequantize_f32(bytes: &[u8], out: &mut [f32]) {
    dequantize_with(bytes, out, 4, f32_at);
}

pub(super) fn dequantize_f16(bytes: &[u8], out: &mut [f32]) {
    dequantize_with(bytes, out, 2, f16_at);
}

pub(super) fn dequantize_bf16(bytes: &[u8], out: &mut [f32]) {
    dequantize_with(bytes, out, 2, bf16_at);
}

pub(super) fn dot_f32(bytes: &[u8], x: &[f32]) -> f64 {
    dot_with(bytes, x, 4, f32_at)
}

pub(super) fn dot_f16(bytes: &[u8], x: &[f32]) -> f64 {
    dot_with(bytes, x, 2, f16_at)
}

pub(super) fn dot_bf16(bytes: &[u8], x: &[f32]) -> f64 {
    dot_with(bytes, x, 2, bf16_at)
}
