//! Repacking gpt-oss MXFP4 tensors into ggml `block_mxfp4` rows.
//!
//! HF stores a row of `n` values as `n/32` groups of 16 bytes (`*_blocks`,
//! element `2i` in the low nibble of byte `i`, `2i+1` in the high nibble)
//! plus one E8M0 exponent per group (`*_scales`). A ggml block is the
//! exponent byte followed by 16 bytes where element `j` is the low nibble of
//! byte `j` and element `j + 16` the high nibble. Only nibbles move; no value
//! changes (the e2m1 codes and exponents are copied).

/// Repacks one 32-element group: `codes` are HF's 16 bytes.
pub fn repack_group(scale: u8, codes: &[u8; 16], out: &mut [u8; 17]) {
    let mut nib = [0u8; 32];
    for (i, b) in codes.iter().enumerate() {
        nib[2 * i] = b & 0x0f;
        nib[2 * i + 1] = b >> 4;
    }
    out[0] = scale;
    for j in 0..16 {
        out[1 + j] = nib[j] | (nib[j + 16] << 4);
    }
}

/// Repacks one row of `groups` groups into ggml blocks (17 bytes each).
pub fn repack_row(blocks: &[u8], scales: &[u8], out: &mut [u8]) {
    for (g, (codes, &scale)) in blocks.chunks_exact(16).zip(scales).enumerate() {
        let codes: &[u8; 16] = codes.try_into().expect("chunks_exact(16)");
        let dst: &mut [u8; 17] = (&mut out[g * 17..g * 17 + 17])
            .try_into()
            .expect("17-byte block");
        repack_group(scale, codes, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_move_to_ggml_positions() {
        // HF element k has code k % 16 (element 2i low, 2i+1 high).
        let mut codes = [0u8; 16];
        for (i, c) in codes.iter_mut().enumerate() {
            let lo = (2 * i % 16) as u8;
            let hi = ((2 * i + 1) % 16) as u8;
            *c = lo | (hi << 4);
        }
        let mut out = [0u8; 17];
        repack_group(130, &codes, &mut out);
        assert_eq!(out[0], 130);
        for j in 0..16 {
            assert_eq!(out[1 + j] & 0x0f, (j % 16) as u8, "element {j}");
            assert_eq!(out[1 + j] >> 4, ((j + 16) % 16) as u8, "element {}", j + 16);
        }
    }
}
