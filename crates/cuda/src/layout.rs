//! How weights are laid out in device memory.
//!
//! Most formats keep ggml's block layout, rows `row_bytes` apart as on the
//! host. The *split* formats (Q8_0, MXFP4), which the matrix-vector kernels
//! read most, are reorganised at upload: each row holds its blocks' code
//! bytes first (32 per Q8_0 block, 16 per MXFP4 block), then the blocks'
//! scales (an f16 or an e8m0 byte each), and rows are padded to 16 bytes,
//! so that a block's codes are one aligned 16- or 32-byte load instead of
//! byte loads across 34- or 17-byte blocks. The bytes themselves are
//! unchanged (kernel `split_rows` in `kernels/layout.cu`; the kernels' row
//! readers are `split_codes` / `split_scale` in `kernels/common.cuh`).

use crate::kernels::{args, launch_elementwise, Kernels};
use cudarc::driver::CudaStream;
use turbospark_backend::BackendError;
use turbospark_core::QuantFormat;

/// Code and scale bytes per block of a split format; `None` for the others.
pub(crate) fn split_parts(format: QuantFormat) -> Option<(usize, usize)> {
    match format {
        QuantFormat::Q8_0 => Some((32, 2)),
        QuantFormat::Mxfp4 => Some((16, 1)),
        _ => None,
    }
}

/// Bytes between rows on the device for rows of `host_row_bytes` on the host.
pub(crate) fn device_row_bytes(format: QuantFormat, host_row_bytes: usize) -> usize {
    match split_parts(format) {
        Some(_) => host_row_bytes.div_ceil(16) * 16,
        None => host_row_bytes,
    }
}

/// Queues the reorganisation of `rows` host-layout rows (`host_row_bytes`
/// apart, at device address `src`) into the device layout at `dst`
/// (`device_row_bytes` apart). Only for split formats; `src` must stay
/// untouched until the stream has run the kernel.
pub(crate) fn queue_split(
    k: &Kernels,
    stream: &CudaStream,
    format: QuantFormat,
    src: u64,
    dst: u64,
    rows: usize,
    host_row_bytes: usize,
) -> Result<(), BackendError> {
    let Some((cb, sb)) = split_parts(format) else {
        return Err(BackendError::Shape {
            op: "upload",
            detail: format!("{format} has no split layout"),
        });
    };
    let nb = host_row_bytes / (cb + sb);
    let dev_rb = device_row_bytes(format, host_row_bytes) as i64;
    let (r, n, c, s, hrb) = (
        rows as i64,
        nb as i32,
        cb as i32,
        sb as i32,
        host_row_bytes as i64,
    );
    let args = &mut args![src, dst, r, n, c, s, hrb, dev_rb];
    launch_elementwise("upload", &k.split_rows, stream, rows * nb, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rows_are_16_byte_multiples_and_hold_the_host_bytes() {
        // 2880 columns: 90 blocks of 34 (Q8_0) or 17 (MXFP4) bytes.
        assert_eq!(device_row_bytes(QuantFormat::Q8_0, 90 * 34), 3072);
        assert_eq!(device_row_bytes(QuantFormat::Mxfp4, 90 * 17), 1536);
        assert_eq!(device_row_bytes(QuantFormat::Mxfp4, 4 * 17), 80);
        assert_eq!(device_row_bytes(QuantFormat::Q4K, 144), 144);
        for f in [QuantFormat::Q8_0, QuantFormat::Mxfp4] {
            let (c, s) = split_parts(f).unwrap();
            assert_eq!(c + s, f.block_bytes(), "{f}");
        }
    }
}
