// Weights into their device row layout (layout.rs): for the split formats
// (Q8_0, MXFP4) each row's blocks `[scale | codes]` become `[codes of every
// block][scales of every block]`, rows `dst_row` bytes apart (16-byte
// multiples). The bytes themselves are unchanged.
//   src: `rows` rows of `nb` blocks of `sb + cb` bytes, `src_row` apart.
KERNEL void split_rows(const u8* __restrict__ src, u8* __restrict__ dst, i64 rows,
                                      int nb, int cb, int sb, i64 src_row, i64 dst_row) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, rows * nb) {
        i64 r = i / nb;
        int b = (int)(i % nb);
        const u8* s = src + r * src_row + (i64)b * (sb + cb);
        u8* d = dst + r * dst_row;
        for (int j = 0; j < sb; j++) d[(i64)nb * cb + b * sb + j] = s[j];
        for (int j = 0; j < cb; j++) d[(i64)b * cb + j] = s[sb + j];
    }
}
