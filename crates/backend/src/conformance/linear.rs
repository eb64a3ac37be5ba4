//! Buffers and copies, embedding lookup, and the matmul (and per-head
//! matmul) of every weight format.

use super::data::{dequantized, f32_tensor, random_matrix, Rng};
use super::reference::dot;
use super::{compare, property, ConformanceError, Context, Harness, Tolerances};
use crate::{DType, Device, DeviceBuf, HeadMatmul, Limits, Route, RouteBuf, Stream};
use turbospark_core::QuantFormat;

/// Allocation (every dtype the device claims, zeroed, refused otherwise),
/// write/read/copy, asynchronous reads, route buffers.
pub fn check_buffers<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "buffers";
    let mut h = Harness::new(dev, Limits::default())?;
    for dtype in DType::ALL {
        let made = dev.alloc(dtype, 64);
        match (dev.supports(dtype), made) {
            (true, Ok(b)) if b.dtype() == dtype && b.len() == 64 => {}
            (true, Ok(b)) => {
                return Err(property(
                    OP,
                    dtype.name(),
                    format!("asked for 64 {dtype}, got {} {}", b.len(), b.dtype()),
                ))
            }
            (true, Err(e)) => return Err(e).at(OP, dtype.name()),
            (false, Ok(_)) => {
                return Err(property(
                    OP,
                    dtype.name(),
                    "allocated a dtype the device says it does not support".into(),
                ))
            }
            (false, Err(_)) => {}
        }
    }
    if !dev.supports(DType::F32) {
        return Err(property(OP, "f32", "every device has f32 buffers".into()));
    }
    let mut rng = Rng(3);
    let v = rng.vec(37);
    let zeros = h.zeros(37)?;
    if h.get(&zeros, 37)?.iter().any(|&x| x != 0.0) {
        return Err(property(OP, "alloc", "a new buffer is not zeroed".into()));
    }
    let a = h.buf(&v)?;
    if h.get(&a, 37)? != v {
        return Err(property(OP, "write/read", "read back other values".into()));
    }
    let mut b = h.zeros(40)?;
    h.st.copy(&a, 5, &mut b, 3, 30).at(OP, "copy")?;
    let got = h.get(&b, 40)?;
    if got[3..33] != v[5..35] || got[..3].iter().chain(&got[33..]).any(|&x| x != 0.0) {
        return Err(property(OP, "copy", "copied the wrong range".into()));
    }
    if h.st.copy(&a, 10, &mut b, 0, 30).is_ok() {
        return Err(property(OP, "copy", "copied past the source's end".into()));
    }
    let mut host = dev.alloc_host(37).at(OP, "alloc_host")?;
    h.st.read_async(&a, 37, &mut host).at(OP, "read_async")?;
    h.st.synchronize().at(OP, "synchronize")?;
    if host.as_ref()[..37] != v[..] {
        return Err(property(OP, "read_async", "read back other values".into()));
    }
    let mut routes = dev.alloc_routes(3, 2).at(OP, "alloc_routes")?;
    if routes.max_tokens() != 3 || routes.top_k() != 2 {
        return Err(property(OP, "alloc_routes", "wrong shape".into()));
    }
    let r: Vec<Route> = (0..6)
        .map(|i| Route {
            slot: i * 3,
            weight: i as f32 / 7.0,
        })
        .collect();
    h.st.write_routes(&mut routes, &r).at(OP, "write_routes")?;
    let mut back = vec![Route::default(); 6];
    h.st.read_routes(&routes, &mut back).at(OP, "read_routes")?;
    if back != r {
        return Err(property(OP, "routes", "read back other routes".into()));
    }
    let _ = dev.memory();
    Ok(())
}

/// `embed` gives the reference-dequantized rows of every format, exactly,
/// and refuses a token past the table.
pub fn check_embed<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    const OP: &str = "embed";
    let mut tables = Vec::new();
    for fmt in QuantFormat::ALL {
        let mut rng = Rng(7 + u64::from(fmt.ggml_type()));
        let cols = if fmt.block_elems() == 1 { 96 } else { 256 };
        let t = random_matrix("token_embd.weight", fmt, 5, cols, &mut rng);
        let m = dev.upload_matrix(&t).at(OP, fmt.name())?;
        tables.push((fmt, t, m));
    }
    let mut h = Harness::new(dev, Limits::default())?;
    for (fmt, t, m) in &tables {
        let cols = t.shape[1];
        let mut out = h.zeros(3 * cols)?;
        h.st.embed(m, &[4, 1, 4], &mut out).at(OP, fmt.name())?;
        let got = h.get(&out, 3 * cols)?;
        let all = dequantized(t);
        let want: Vec<f64> = [4, 1, 4]
            .iter()
            .flat_map(|&r| all[r * cols..(r + 1) * cols].iter().map(|&v| f64::from(v)))
            .collect();
        compare(OP, fmt.name(), &got, &want, 0.0, |_| 0.0)?;
        if h.st.embed(m, &[5], &mut out).is_ok() {
            return Err(property(OP, fmt.name(), "a token past the table".into()));
        }
    }
    Ok(())
}

/// Inputs of a matmul case: widths that are a few blocks of the format,
/// an odd row count, and batches of 1, 4 and 5 (gemv, a whole gemm tile,
/// a tile plus a remainder).
fn matmul_cols(fmt: QuantFormat) -> usize {
    match fmt.block_elems() {
        1 => 200,
        32 => 160,
        _ => 512,
    }
}

const MATMUL_ROWS: usize = 37;
/// Enough tokens that backends' batched (tensor-core) paths take part.
const MATMUL_TOKENS: usize = 40;

/// Widths of real models' rows (gpt-oss's 2880, 4096, and one past it) for
/// the formats whose products backends specialise by row width (8-bit
/// activation kernels, bf16 on tensor cores): a row of several stretches
/// of blocks, and a partial last stretch.
const WIDE_COLS: [usize; 3] = [2880, 4096, 4160];
/// And narrow rows of those formats: 3 and 11 chunks of 32 (a bf16
/// tensor-core block of 1 and 3 segments, fewer threads than the tile's
/// outputs; 8-bit rows of one partial chunk and of three).
const NARROW_COLS: [usize; 2] = [96, 352];
const WIDE_FORMATS: [QuantFormat; 3] = [QuantFormat::Q8_0, QuantFormat::Mxfp4, QuantFormat::Bf16];
/// Plain float rows of whole 32-column chunks, which backends may decode
/// onto the tensor cores as they do bf16 (their usual width, 200, is not
/// whole chunks): 352 columns, 3 segments.
const CHUNKED_FLOATS: [(QuantFormat, usize); 2] =
    [(QuantFormat::F32, 352), (QuantFormat::F16, 352)];
/// Q4_K and Q6_K rows of many super-blocks, which backends may take
/// several at a time (11 and 17 of 256 columns: a last group partial,
/// more than one round of loads; Q6_K rows of 11 start every other one 2
/// bytes past a 4-byte word).
const WIDE_K_QUANTS: [(QuantFormat, usize); 4] = [
    (QuantFormat::Q4K, 2816),
    (QuantFormat::Q4K, 4352),
    (QuantFormat::Q6K, 2816),
    (QuantFormat::Q6K, 4352),
];

/// `matmul` of every format (and of wide and narrow rows of some,
/// [`WIDE_COLS`], [`NARROW_COLS`], [`CHUNKED_FLOATS`], [`WIDE_K_QUANTS`])
/// against the f64 dot of the reference-dequantized rows, within
/// `tol.matmul · Σ|w·x|`; a batch's rows equal the same rows computed
/// alone, bit for bit; products of one input issued one after another give
/// each the bits it has alone, also with more rows than a GPU has SMs
/// for tiles of 16.
pub fn check_matmul<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "matmul";
    let mut cases = Vec::new();
    let shapes = QuantFormat::ALL
        .iter()
        .map(|&f| (f, matmul_cols(f)))
        .chain(WIDE_FORMATS.iter().flat_map(|&f| {
            WIDE_COLS
                .iter()
                .chain(NARROW_COLS.iter())
                .map(move |&c| (f, c))
        }))
        .chain(CHUNKED_FLOATS)
        .chain(WIDE_K_QUANTS);
    for (fmt, cols) in shapes {
        let mut rng = Rng(0x5eed ^ u64::from(fmt.ggml_type()) ^ (cols as u64) << 8);
        let t = random_matrix(fmt.name(), fmt, MATMUL_ROWS, cols, &mut rng);
        let m = dev.upload_matrix(&t).at(OP, fmt.name())?;
        if dev.matrix_shape(&m) != [MATMUL_ROWS, cols] {
            return Err(property(OP, fmt.name(), "matrix_shape".into()));
        }
        cases.push((fmt, t, m, rng.vec(MATMUL_TOKENS * cols)));
    }
    let limits = Limits {
        max_tokens: MATMUL_TOKENS,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    for (fmt, t, m, x) in &cases {
        let cols = t.shape[1];
        let w = dequantized(t);
        let xb = h.buf(x)?;
        let mut out = h.zeros(MATMUL_TOKENS * MATMUL_ROWS)?;
        let mut batch = Vec::new();
        for n in [1, 4, 5, MATMUL_TOKENS] {
            h.st.matmul(m, &xb, n, &mut out).at(OP, fmt.name())?;
            let got = h.get(&out, n * MATMUL_ROWS)?;
            let (want, mag) = reference_products(&w, x, MATMUL_ROWS, cols, n);
            let case = format!("{fmt} × {cols}, {n} tokens");
            compare(OP, &case, &got, &want, tol.matmul, |i| mag[i])?;
            batch = got;
        }
        // Token 4 alone (a gemv) gives the bits it had in the batch.
        let x4 = h.buf(&x[4 * cols..5 * cols])?;
        h.st.matmul(m, &x4, 1, &mut out).at(OP, fmt.name())?;
        let alone = h.get(&out, MATMUL_ROWS)?;
        if tol.batch_invariant && alone[..] != batch[4 * MATMUL_ROWS..5 * MATMUL_ROWS] {
            return Err(property(
                OP,
                fmt.name(),
                "a token alone differs from the same token in a batch".into(),
            ));
        }
        if h.st.matmul(m, &x4, 2, &mut out).is_ok() {
            return Err(property(OP, fmt.name(), "read past the input".into()));
        }
    }
    check_products_of_one_input(dev, &mut h, tol)?;
    check_tall_products_of_one_input(dev, &mut h, tol)
}

/// The f64 reference of `n` tokens' products with a `rows × cols`
/// matrix `w` (row-major), token-major as a backend writes them, and each
/// value's magnitude (`Σ |w·x|`, for [`compare`]'s tolerance).
fn reference_products(
    w: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    (0..n * rows)
        .map(|i| {
            let (tok, r) = (i / rows, i % rows);
            dot(
                &w[r * cols..(r + 1) * cols],
                &x[tok * cols..(tok + 1) * cols],
            )
        })
        .unzip()
}

/// Rows of [`check_tall_products_of_one_input`]'s three products: a
/// gpt-oss layer's q/k/v halved, 160 tiles of 16 rows together, the first
/// alone 128.
const TALL_ROWS: [usize; 3] = [2048, 256, 256];

/// Three products of one input with more 16-row tiles together than an
/// H100 or H200 has SMs (132), where a backend may spread a few tokens'
/// products otherwise than fewer rows (the CUDA backend: a warp a segment
/// of a tile in small blocks, instead of a block a tile): bf16 rows 2880
/// wide, for 1 and 5 tokens, each product within `tol.matmul` of the f64
/// reference and the same bits as issued alone (the first, alone, has
/// fewer tiles than SMs); and the first matrix's token 4 alone the bits it
/// has in a batch of [`MATMUL_TOKENS`].
fn check_tall_products_of_one_input<D: Device>(
    dev: &D,
    h: &mut Harness<'_, D>,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "matmul";
    let (fmt, cols) = (QuantFormat::Bf16, WIDE_COLS[0]);
    let mut rng = Rng(0x7a11);
    let ts: Vec<_> = TALL_ROWS
        .iter()
        .enumerate()
        .map(|(i, &r)| random_matrix(&format!("tall {i}"), fmt, r, cols, &mut rng))
        .collect();
    let ms = ts
        .iter()
        .map(|t| dev.upload_matrix(t).at(OP, "tall bf16"))
        .collect::<Result<Vec<_>, _>>()?;
    let ws: Vec<Vec<f32>> = ts.iter().map(dequantized).collect();
    let x = rng.vec(MATMUL_TOKENS * cols);
    let xb = h.buf(&x)?;
    for n in [1, 5] {
        let mut outs = TALL_ROWS
            .iter()
            .map(|&r| h.zeros(n * r))
            .collect::<Result<Vec<_>, _>>()?;
        for (m, out) in ms.iter().zip(outs.iter_mut()) {
            h.st.matmul(m, &xb, n, out).at(OP, "tall bf16")?;
        }
        let together = TALL_ROWS
            .iter()
            .zip(&outs)
            .map(|(&r, o)| h.get(o, n * r))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, ((w, m), &r)) in ws.iter().zip(&ms).zip(&TALL_ROWS).enumerate() {
            let (want, mag) = reference_products(w, &x, r, cols, n);
            let case = format!("{fmt} {r} × {cols}, {n} tokens, product {i} of three of one input");
            compare(OP, &case, &together[i], &want, tol.matmul, |j| mag[j])?;
            let mut out = h.zeros(n * r)?;
            h.st.matmul(m, &xb, n, &mut out).at(OP, "tall bf16")?;
            if tol.batch_invariant && h.get(&out, n * r)? != together[i] {
                return Err(property(
                    OP,
                    "tall bf16",
                    format!("{n} tokens: product {i} of three of one input differs from the product alone"),
                ));
            }
        }
    }
    let r = TALL_ROWS[0];
    let mut out = h.zeros(MATMUL_TOKENS * r)?;
    h.st.matmul(&ms[0], &xb, MATMUL_TOKENS, &mut out)
        .at(OP, "tall bf16")?;
    let batch = h.get(&out, MATMUL_TOKENS * r)?;
    let x4 = h.buf(&x[4 * cols..5 * cols])?;
    h.st.matmul(&ms[0], &x4, 1, &mut out).at(OP, "tall bf16")?;
    if tol.batch_invariant && h.get(&out, r)? != batch[4 * r..5 * r] {
        return Err(property(
            OP,
            "tall bf16",
            "a token alone differs from the same token in a batch".into(),
        ));
    }
    Ok(())
}

/// Three products of one token's input issued one after another (a layer's
/// q, k and v, which a backend may launch together), of wide rows: each
/// within `tol.matmul` of the f64 reference, and the same bits as the
/// product issued alone; a bias added straight after a product (which a
/// backend may join to it) gives the f32 sum of the product's bits and
/// the bias.
fn check_products_of_one_input<D: Device>(
    dev: &D,
    h: &mut Harness<'_, D>,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "matmul";
    let cols = WIDE_COLS[0];
    for fmt in WIDE_FORMATS {
        let mut rng = Rng(0x9e0 ^ u64::from(fmt.ggml_type()));
        let rows = [MATMUL_ROWS, 8, 13];
        let ts: Vec<_> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| random_matrix(&format!("{fmt} {i}"), fmt, r, cols, &mut rng))
            .collect();
        let ms = ts
            .iter()
            .map(|t| dev.upload_matrix(t).at(OP, fmt.name()))
            .collect::<Result<Vec<_>, _>>()?;
        let x = rng.vec(cols);
        let xb = h.buf(&x)?;
        let mut outs = rows
            .iter()
            .map(|&r| h.zeros(r))
            .collect::<Result<Vec<_>, _>>()?;
        for (m, out) in ms.iter().zip(outs.iter_mut()) {
            h.st.matmul(m, &xb, 1, out).at(OP, fmt.name())?;
        }
        let together = rows
            .iter()
            .zip(&outs)
            .map(|(&r, o)| h.get(o, r))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, ((t, m), &r)) in ts.iter().zip(&ms).zip(&rows).enumerate() {
            let w = dequantized(t);
            let (want, mag) = reference_products(&w, &x, r, cols, 1);
            let case = format!("{fmt} × {cols}, product {i} of three of one input");
            compare(OP, &case, &together[i], &want, tol.matmul, |j| mag[j])?;
            let mut out = h.zeros(r)?;
            h.st.matmul(m, &xb, 1, &mut out).at(OP, fmt.name())?;
            let alone = h.get(&out, r)?;
            if tol.batch_invariant && alone != together[i] {
                return Err(property(
                    OP,
                    fmt.name(),
                    format!("product {i} of three of one input differs from the product alone"),
                ));
            }
            let b = rng.vec(r);
            let bias = dev
                .upload_vector(&f32_tensor("bias", vec![r], &b))
                .at(OP, fmt.name())?;
            h.st.matmul(m, &xb, 1, &mut out).at(OP, fmt.name())?;
            h.st.add_bias(&mut out, &bias, 1).at(OP, fmt.name())?;
            let biased = h.get(&out, r)?;
            let want: Vec<f32> = alone.iter().zip(&b).map(|(v, b)| v + b).collect();
            if biased != want {
                return Err(property(
                    OP,
                    fmt.name(),
                    format!(
                        "product {i} then its bias differs from the product's bits plus the bias"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `head_matmul` of every format, plain and transposed, against the f64
/// reference over the reference-dequantized head blocks (within
/// `tol.matmul · Σ|w·x|`); elements outside each head's output keep their
/// values; a token alone gives the bits it has in a batch; a head block
/// past the matrix is refused. A backend without the op (it answers
/// [`BackendError::Unsupported`](crate::BackendError::Unsupported)) passes.
pub fn check_head_matmul<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "head_matmul";
    const HEADS: usize = 3;
    // Each head's block: 3 rows used transposed over 4 rows used as they are.
    const STRIDE: usize = 7;
    let mut cases = Vec::new();
    for fmt in QuantFormat::ALL {
        let mut rng = Rng(0xbeef ^ u64::from(fmt.ggml_type()));
        let cols = matmul_cols(fmt);
        let t = random_matrix(fmt.name(), fmt, HEADS * STRIDE, cols, &mut rng);
        let m = dev.upload_matrix(&t).at(OP, fmt.name())?;
        cases.push((fmt, t, m));
    }
    let limits = Limits {
        max_tokens: MATMUL_TOKENS,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    for (fmt, t, m) in &cases {
        let cols = t.shape[1];
        let w = dequantized(t);
        for (transpose, first_row, rows) in [(true, 0, 3), (false, 3, 4)] {
            let (input, output) = if transpose {
                (rows, cols)
            } else {
                (cols, rows)
            };
            // Inputs and outputs sit inside wider per-head rows.
            let (x_at, out_at) = (2, 5);
            let (x_stride, out_stride) = (input + 3, output + 7);
            let heads = MATMUL_TOKENS * HEADS;
            let mut rng = Rng(0xf00d ^ u64::from(fmt.ggml_type()));
            let x = rng.vec(heads * x_stride);
            let fill = rng.vec(heads * out_stride);
            let xb = h.buf(&x)?;
            let case = format!("{fmt}, {}", if transpose { "transposed" } else { "plain" });
            let mut batch = Vec::new();
            for n in [1, MATMUL_TOKENS] {
                let p = HeadMatmul {
                    n_tokens: n,
                    n_heads: HEADS,
                    head_stride: STRIDE,
                    first_row,
                    rows,
                    transpose,
                    x_stride,
                    x_at,
                    out_stride,
                    out_at,
                };
                let mut out = h.buf(&fill)?;
                match h.st.head_matmul(m, &xb, &p, &mut out) {
                    Err(crate::BackendError::Unsupported { .. }) => return Ok(()),
                    r => r.at(OP, &case)?,
                }
                let got = h.get(&out, heads * out_stride)?;
                let (want, mag): (Vec<f64>, Vec<f64>) = (0..heads * out_stride)
                    .map(|e| {
                        let (th, k) = (e / out_stride, e % out_stride);
                        let (tok, hd) = (th / HEADS, th % HEADS);
                        if tok >= n || k < out_at || k >= out_at + output {
                            return (f64::from(fill[e]), 0.0);
                        }
                        let o = k - out_at;
                        let xin = &x[th * x_stride + x_at..][..input];
                        let row = |i: usize| {
                            let r = hd * STRIDE + first_row + i;
                            &w[r * cols..(r + 1) * cols]
                        };
                        if transpose {
                            let terms: Vec<f64> = (0..rows)
                                .map(|i| f64::from(row(i)[o]) * f64::from(xin[i]))
                                .collect();
                            (terms.iter().sum(), terms.iter().map(|v| v.abs()).sum())
                        } else {
                            dot(row(o), xin)
                        }
                    })
                    .unzip();
                compare(
                    OP,
                    &format!("{case}, {n} tokens"),
                    &got,
                    &want,
                    tol.matmul,
                    |i| mag[i],
                )?;
                batch = got;
            }
            // The last token alone gives the bits it had in the batch.
            let last = (MATMUL_TOKENS - 1) * HEADS;
            let x1 = h.buf(&x[last * x_stride..])?;
            let p = HeadMatmul {
                n_tokens: 1,
                n_heads: HEADS,
                head_stride: STRIDE,
                first_row,
                rows,
                transpose,
                x_stride,
                x_at,
                out_stride,
                out_at,
            };
            let mut out = h.buf(&fill[last * out_stride..])?;
            h.st.head_matmul(m, &x1, &p, &mut out).at(OP, &case)?;
            let alone = h.get(&out, HEADS * out_stride)?;
            if tol.batch_invariant && alone[..] != batch[last * out_stride..] {
                return Err(property(
                    OP,
                    &case,
                    "a token alone differs from the same token in a batch".into(),
                ));
            }
            let past = HeadMatmul {
                head_stride: 2 * STRIDE,
                ..p
            };
            if h.st.head_matmul(m, &x1, &past, &mut out).is_ok() {
                return Err(property(OP, &case, "read heads past the matrix".into()));
            }
        }
    }
    Ok(())
}
