//! Matrix products on a [`CudaStream`] (`out[t, o] = Σ_i W[o, i] · x[t, i]`):
//! in fast numerics 8-bit activations for Q8_0/MXFP4 weights
//! (`kernels/q8dot.cu`, `q8one.cu`, `mmq.cu`, `q8mma.cu`), and (unless
//! `TURBOSPARK_CUDA_KQ=tc`) for Q4_K, Q6_K and the legacy 4- and
//! 5-bit formats (`kernels/kq.cu`); the tensor cores for the other formats
//! (`kernels/tcmm.cu`); each held back so that the products of one input
//! and the bias add after them join one launch (`crate::fusion`);
//! matmul.cu's generic kernel otherwise.

use super::moe::RoutedQ8;
use super::{CudaStream, Q8Regions};
use crate::fusion::{self, GroupLaunch, MatGroup, Pending, Q8Out, TileLaunch};
use crate::kernels::{self, args, launch};
use crate::types::{CudaBuf, CudaMatrix, CudaVector};
use turbospark_backend::{BackendError, Numerics};
use turbospark_core::QuantFormat;

/// Whether a product of `w` (a format with tensor-core kernels) with the
/// input at `x` fits them (`kernels/tcmm.cu`): rows whole chunks of 32
/// columns, the matrix and its row stride aligned as the format's loads
/// need ([`kernels::tc_aligned`]), the input 16-byte aligned.
fn tc_fits(w: &CudaMatrix, x: u64) -> bool {
    w.cols % kernels::TC_CHUNK == 0
        && kernels::tc_aligned(w.format, w.mem.ptr, w.row_bytes)
        && x % 16 == 0
}

impl CudaStream {
    /// A fast matmul (8-bit activations: Q8_0, MXFP4, and kq.cu's formats
    /// where [`Self::kq_takes`]) of `n` rows of `x` into `out`, held back for its
    /// bias and the products that share its input (see [`crate::fusion`]);
    /// a pending norm of `x` quantizes it on the way.
    fn matmul_q8(
        &mut self,
        w: &CudaMatrix,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        self.bind_holding("matmul")?;
        let r = self.q8_regions("matmul", n * w.cols, 0)?;
        // The kernel order: MXFP4's differs from Q8_0's.
        let order = usize::from(w.format == QuantFormat::Mxfp4);
        let key = (x, n * w.cols, order);
        let gemv = n < kernels::MMQ_MIN_TOKENS;
        match self.pending.get() {
            Some(Pending::Group(g))
                if gemv
                    && g.takes(w.format, x, n, w.cols, true)
                    && self.quantized.get() == Some(key) =>
            {
                let mut g = g;
                g.group.push(w.mem.ptr, w.rows, w.row_bytes, out);
                self.pending.set(Some(Pending::Group(g)));
                self.forget_quantized_if(out);
                return Ok(());
            }
            Some(Pending::Norm(nl))
                if nl.out == x
                    && nl.dim == w.cols
                    && nl.rows == n
                    && nl.dim % 32 == 0
                    && nl.dim <= fusion::NORM_HELD =>
            {
                self.pending.set(None);
                // One token's Q8_0 product may be a router, whose MXFP4
                // routed experts then read the same codes in their order:
                // the norm writes both (the experts' own quantization
                // launch saved) only with TURBOSPARK_CUDA_GATE_UP=wait;
                // otherwise the gate/up products start early, which needs
                // that launch between the routing and them.
                let both = Q8Regions::new(nl.dim, 0);
                let mxfp4 = (n == 1
                    && w.format == QuantFormat::Q8_0
                    && both.bytes <= self.routed_x.bytes
                    && !self.early_gate_up())
                .then(|| RoutedQ8 {
                    x,
                    values: nl.dim,
                    xq: self.routed_x.ptr,
                    xd: self.routed_x.ptr + both.xd,
                });
                let q = Q8Out {
                    codes: r.xq,
                    scales: r.xd,
                    order: order as i32,
                    mxfp4_codes: mxfp4.map_or(0, |m| m.xq),
                    mxfp4_scales: mxfp4.map_or(0, |m| m.xd),
                };
                fusion::launch_pending(&self.k, self.raw(), Pending::Norm(nl), Some(q))?;
                self.routed_q8.set(mxfp4);
                self.quantized.set(Some(key));
            }
            _ => self.flush()?,
        }
        if self.quantized.get() != Some(key) {
            // kq.cu's formats take the activations in natural order, as Q8_0 does.
            let quantizer = match w.format {
                QuantFormat::Mxfp4 => QuantFormat::Mxfp4,
                _ => QuantFormat::Q8_0,
            };
            let set = self
                .q8_set(quantizer)
                .expect("fast numerics (checked by matmul)");
            self.quantize(set, x, n * w.cols, r.xq, r.xd)?;
            self.quantized.set(Some(key));
        }
        // Matrix-vector kernels, tensor-core tiles for batches (the same
        // bits; only speed decides).
        let p = if gemv {
            Pending::Group(GroupLaunch {
                format: w.format,
                group: MatGroup::one(w.mem.ptr, w.rows, w.row_bytes, out),
                x,
                cols: w.cols,
                n,
                q8: true,
                xq: r.xq,
                xd: r.xd,
            })
        } else {
            Pending::Tile(TileLaunch {
                format: w.format,
                w: w.mem.ptr,
                rows: w.rows,
                cols: w.cols,
                row_bytes: w.row_bytes,
                n,
                xq: r.xq,
                xd: r.xd,
                out,
                bias: 0,
            })
        };
        self.pending.set(Some(p));
        self.forget_quantized_if(out);
        Ok(())
    }

    /// A fast product on the tensor cores (`kernels/tcmm.cu`: bf16 weights,
    /// or weights decoded to bf16), held back for its bias and the products
    /// of the same input that follow (one launch, as [`Self::matmul_q8`]'s).
    fn matmul_tc(
        &mut self,
        w: &CudaMatrix,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), BackendError> {
        self.bind_holding("matmul")?;
        match self.pending.get() {
            Some(Pending::Group(mut g))
                if g.takes(w.format, x, n, w.cols, false)
                    && out != x
                    && !g.group.out[..g.group.count as usize].contains(&x) =>
            {
                g.group.push(w.mem.ptr, w.rows, w.row_bytes, out);
                self.pending.set(Some(Pending::Group(g)));
            }
            _ => {
                self.flush()?;
                self.pending.set(Some(Pending::Group(GroupLaunch {
                    format: w.format,
                    group: MatGroup::one(w.mem.ptr, w.rows, w.row_bytes, out),
                    x,
                    cols: w.cols,
                    n,
                    q8: false,
                    xq: 0,
                    xd: 0,
                })));
            }
        }
        self.forget_quantized_if(out);
        Ok(())
    }

    /// Whether a fast product of `w` with the input at `x` takes kq.cu's
    /// integer kernels: loaded (not `TURBOSPARK_CUDA_KQ=tc`), a format
    /// they have, and a matrix they fit ([`kernels::kq_fits`]).
    fn kq_takes(&self, w: &CudaMatrix, x: u64) -> bool {
        self.numerics == Numerics::Fast
            && self
                .k
                .kq
                .as_ref()
                .is_some_and(|kq| kq.get(w.format).is_some())
            && kernels::kq_fits(w.format, w.cols, w.mem.ptr, w.row_bytes, x)
    }

    /// Forgets the quantized input when `out` overwrites it.
    fn forget_quantized_if(&self, out: u64) {
        if self.quantized.get().is_some_and(|(p, ..)| p == out) {
            self.quantized.set(None);
        }
    }

    pub(super) fn enqueue_matmul(
        &mut self,
        w: &CudaMatrix,
        x: &CudaBuf,
        n: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let xp = x.f32_ptr("matmul", "x", n * w.cols)?;
        let op = out.f32_ptr("matmul", "out", n * w.rows)?;
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        if self.q8_set(w.format).is_some() || self.kq_takes(w, xp) {
            return self.matmul_q8(w, xp, n, op);
        }
        if self.numerics == Numerics::Fast
            && self
                .k
                .tc
                .as_ref()
                .is_some_and(|tc| tc.get(w.format).is_some())
            && tc_fits(w, xp)
        {
            return self.matmul_tc(w, xp, n, op);
        }
        self.bind("matmul")?;
        let grid = (
            w.rows.div_ceil(kernels::MM_WARPS) as u32,
            n.div_ceil(kernels::MM_TOKENS) as u32,
            1,
        );
        let (rows, cols, rb, nn) = (w.rows as i32, w.cols as i32, w.row_bytes as i64, n as i32);
        launch(
            "matmul",
            self.k.matmul.get(w.format),
            self.raw(),
            grid,
            (kernels::MM_WARPS * 32) as u32,
            0,
            &mut args![w.mem.ptr, rows, cols, rb, xp, nn, op],
        )
    }

    pub(super) fn enqueue_add_bias(
        &mut self,
        x: &mut CudaBuf,
        bias: &CudaVector,
        n: usize,
    ) -> Result<(), BackendError> {
        let d = bias.len;
        let xp = x.f32_ptr("add_bias", "x", n * d)?;
        // Joins the held product that wrote x.
        match self.pending.get() {
            Some(Pending::Group(mut g)) if g.n == n => {
                if let Some((out, rows, b)) = g.group.last() {
                    if out == xp && rows == d && *b == 0 {
                        *b = bias.mem.ptr;
                        self.pending.set(Some(Pending::Group(g)));
                        return Ok(());
                    }
                }
            }
            Some(Pending::Tile(mut t)) if t.out == xp && t.n == n && t.rows == d && t.bias == 0 => {
                t.bias = bias.mem.ptr;
                self.pending.set(Some(Pending::Tile(t)));
                return Ok(());
            }
            _ => {}
        }
        let (nn, dd) = (n as i32, d as i32);
        self.elementwise(
            "add_bias",
            &self.k.add_bias,
            n * d,
            &mut args![xp, bias.mem.ptr, nn, dd],
        )
    }
}
