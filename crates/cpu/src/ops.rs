//! The [`Stream`] ops of [`CpuStream`], each checking its buffers' lengths
//! and dtypes before touching them.

use crate::attention::AttentionInputs;
use crate::dequant::dequantize;
use crate::device::{refill_matrix, refill_vector};
use crate::disjoint::DisjointMut;
use crate::pool::split;
use crate::scratch::StreamScratch;
use crate::stream::{add_bias_slice, parallel, CpuStream};
use crate::types::{CpuBank, CpuBuf, CpuHostBuf, CpuMatrix, CpuRoutes, CpuVector};
use crate::{
    check_len, delta_net, elementwise, ggml, head_matmul, kernels, moe, rope, shape_err, CpuDevice,
};
use turbospark_backend::routing::route_token;
use turbospark_backend::{
    bias_mismatch, check_rope, check_tokens, routes_for, AttentionParams, AttentionPart,
    BackendError, ConvParams, DeltaNetInput, DeltaNetLens, DeltaNetParams, ExpertTensors,
    HeadMatmul, MoeInput, MoeScratch, Numerics, RopeTable, Route, RouterSpec, RouterTables, Stream,
};
use turbospark_core::arch::{Activation, NormSpec};

impl Stream<CpuDevice> for CpuStream {
    fn synchronize(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn write(&mut self, dst: &mut CpuBuf, src: &[f32]) -> Result<(), BackendError> {
        let dst = dst.f32s_mut("write", "dst")?;
        check_len("write", "dst", dst.len(), src.len())?;
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read_async(
        &mut self,
        src: &CpuBuf,
        len: usize,
        dst: &mut CpuHostBuf,
    ) -> Result<(), BackendError> {
        let src = src.f32s("read_async", "src")?;
        check_len("read_async", "src", src.len(), len)?;
        check_len("read_async", "dst", dst.data.len(), len)?;
        dst.data[..len].copy_from_slice(&src[..len]);
        Ok(())
    }

    fn read(&mut self, src: &CpuBuf, dst: &mut [f32]) -> Result<(), BackendError> {
        let src = src.f32s("read", "src")?;
        check_len("read", "src", src.len(), dst.len())?;
        dst.copy_from_slice(&src[..dst.len()]);
        Ok(())
    }

    fn copy(
        &mut self,
        src: &CpuBuf,
        src_at: usize,
        dst: &mut CpuBuf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        if src.dtype != dst.dtype {
            return Err(BackendError::DType {
                op: "copy",
                what: "dst",
                expected: src.dtype,
                found: dst.dtype,
            });
        }
        check_len("copy", "src", src.data.len(), src_at.saturating_add(len))?;
        check_len("copy", "dst", dst.data.len(), dst_at.saturating_add(len))?;
        dst.data[dst_at..dst_at + len].copy_from_slice(&src.data[src_at..src_at + len]);
        Ok(())
    }

    fn write_routes(&mut self, dst: &mut CpuRoutes, src: &[Route]) -> Result<(), BackendError> {
        check_len("write_routes", "dst", dst.routes.len(), src.len())?;
        dst.routes[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read_routes(&mut self, src: &CpuRoutes, dst: &mut [Route]) -> Result<(), BackendError> {
        check_len("read_routes", "src", src.routes.len(), dst.len())?;
        dst.copy_from_slice(&src.routes[..dst.len()]);
        Ok(())
    }

    fn fill_slot(
        &mut self,
        bank: &mut CpuBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        let available = bank.experts.len();
        let e = bank
            .experts
            .get_mut(slot)
            .ok_or(BackendError::BadRoute { slot, available })?;
        refill_matrix(self.isa, &mut e.gate, &expert.gate)?;
        refill_matrix(self.isa, &mut e.up, &expert.up)?;
        refill_matrix(self.isa, &mut e.down, &expert.down)?;
        for (v, t) in [
            (e.gate_bias.as_mut(), expert.gate_bias.as_ref()),
            (e.up_bias.as_mut(), expert.up_bias.as_ref()),
            (e.down_bias.as_mut(), expert.down_bias.as_ref()),
        ] {
            match (v, t) {
                (Some(v), Some(t)) => refill_vector(v, t)?,
                (None, None) => {}
                _ => return Err(bias_mismatch(expert)),
            }
        }
        Ok(())
    }

    fn embed(
        &mut self,
        table: &CpuMatrix,
        tokens: &[u32],
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let d = table.cols;
        let out = out.f32s_mut("embed", "out")?;
        check_len("embed", "out", out.len(), tokens.len() * d)?;
        check_tokens(tokens, table.rows)?;
        for (t, &tok) in tokens.iter().enumerate() {
            dequantize(
                table.format,
                table.row(tok as usize),
                &mut out[t * d..(t + 1) * d],
            )
            .map_err(|source| BackendError::Quant {
                name: table.name.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        w: &CpuMatrix,
        x: &CpuBuf,
        n: usize,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        self.matmul_slices(w, x.f32s("matmul", "x")?, n, out.f32s_mut("matmul", "out")?)
    }

    fn head_matmul(
        &mut self,
        w: &CpuMatrix,
        x: &CpuBuf,
        p: &HeadMatmul,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let x = x.f32s("head_matmul", "x")?;
        let out = out.f32s_mut("head_matmul", "out")?;
        p.check(w.rows, w.cols, x.len(), out.len())?;
        let threads = &mut self.scratch.threads;
        head_matmul::head_matmul(&self.pool, threads, w, x, p, out)
    }

    fn add_bias(&mut self, x: &mut CpuBuf, bias: &CpuVector, n: usize) -> Result<(), BackendError> {
        add_bias_slice(x.f32s_mut("add_bias", "x")?, bias, n)
    }

    fn rms_norm(
        &mut self,
        x: &mut CpuBuf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&CpuVector>,
    ) -> Result<(), BackendError> {
        let x = x.f32s_mut("rms_norm", "x")?;
        check_len("rms_norm", "x", x.len(), rows * dim)?;
        let weight = match (spec.has_weight(), weight) {
            (true, Some(w)) if w.data.len() == dim => Some(w.data.as_slice()),
            (false, None) => None,
            (true, w) => {
                return Err(shape_err(
                    "rms_norm",
                    format!(
                        "a {:?} norm of width {dim} needs a {dim}-element weight, got {:?}",
                        spec.scale,
                        w.map(|w| w.data.len())
                    ),
                ))
            }
            (false, Some(_)) => {
                return Err(shape_err(
                    "rms_norm",
                    "a no-scale norm takes no weight".into(),
                ))
            }
        };
        if self.llama_cpp() {
            ggml::ops::rms_norm(&mut x[..rows * dim], dim, spec, weight);
        } else if self.numerics == Numerics::Fast {
            kernels::rms_norm(self.isa, &mut x[..rows * dim], dim, spec, weight);
        } else {
            elementwise::rms_norm(&mut x[..rows * dim], dim, spec, weight);
        }
        Ok(())
    }

    fn rope(
        &mut self,
        x: &mut CpuBuf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError> {
        check_rope(table, head_dim)?;
        let len = n_tokens * n_heads * head_dim;
        let x = x.f32s_mut("rope", "x")?;
        check_len("rope", "x", x.len(), len)?;
        if self.llama_cpp() && ggml::ops::rope_supported(table) {
            let trig = &mut self.scratch.threads[0].trig;
            if trig.len() < table.rotary_dim {
                return Err(BackendError::ScratchTooSmall {
                    op: "rope",
                    need: table.rotary_dim,
                    have: trig.len(),
                });
            }
            ggml::ops::rope(&mut x[..len], n_heads, head_dim, first_pos, table, trig);
        } else {
            let cache = &mut self.scratch.rope_trig;
            rope::rope(&mut x[..len], n_heads, head_dim, first_pos, table, cache);
        }
        Ok(())
    }

    fn kv_write(
        &mut self,
        cache: &mut CpuBuf,
        src: &CpuBuf,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
    ) -> Result<(), BackendError> {
        if n_tokens > capacity {
            return Err(shape_err(
                "kv_write",
                format!("{n_tokens} rows into a {capacity}-row cache"),
            ));
        }
        let cache = cache.f32s_mut("kv_write", "cache")?;
        let src = src.f32s("kv_write", "src")?;
        check_len("kv_write", "cache", cache.len(), capacity * row_len)?;
        check_len("kv_write", "src", src.len(), n_tokens * row_len)?;
        for t in 0..n_tokens {
            let slot = (first_pos + t) % capacity;
            let dst = &mut cache[slot * row_len..(slot + 1) * row_len];
            let src = &src[t * row_len..(t + 1) * row_len];
            if self.llama_cpp() {
                // llama.cpp's cache is f16: store the values it would hold.
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = ggml::quantize::round_f16(v);
                }
            } else {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

    fn attention(
        &mut self,
        q: &CpuBuf,
        k_cache: &CpuBuf,
        v_cache: &CpuBuf,
        p: &AttentionParams,
        sinks: Option<&CpuVector>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let q = q.f32s("attention", "q")?;
        let k_cache = k_cache.f32s("attention", "k_cache")?;
        let v_cache = v_cache.f32s("attention", "v_cache")?;
        let out = out.f32s_mut("attention", "out")?;
        if p.n_tokens == 0 {
            return Ok(());
        }
        let max_keys = p.check()?;
        let q_len = p.n_tokens * p.n_heads * p.head_dim;
        let cache_len = p.capacity * p.n_kv_heads * p.head_dim;
        check_len("attention", "q", q.len(), q_len)?;
        check_len("attention", "k_cache", k_cache.len(), cache_len)?;
        check_len("attention", "v_cache", v_cache.len(), cache_len)?;
        check_len("attention", "out", out.len(), q_len)?;
        if let Some(s) = sinks {
            check_len("attention", "sinks", s.data.len(), p.n_heads)?;
        }
        let llama_cpp = self.llama_cpp();
        let (fast, isa) = (self.numerics == Numerics::Fast, self.isa);
        let StreamScratch { threads, .. } = &mut self.scratch;
        let first = &threads[0];
        if first.scores.len() < max_keys {
            return Err(BackendError::ScratchTooSmall {
                op: "attention",
                need: max_keys,
                have: first.scores.len(),
            });
        }
        if llama_cpp && first.q16.len() < p.head_dim {
            return Err(BackendError::ScratchTooSmall {
                op: "attention",
                need: p.head_dim,
                have: first.q16.len(),
            });
        }
        let inputs = AttentionInputs {
            q,
            k_cache,
            v_cache,
            params: p,
            sinks: sinks.map(|s| s.data.as_slice()),
        };
        let hd = p.head_dim;
        if fast && kernels::attends_heads(isa, p) {
            // Items of up to HEADS_PER_ITEM query heads sharing a KV head.
            let group = p.n_heads / p.n_kv_heads;
            let chunks = group.div_ceil(kernels::HEADS_PER_ITEM);
            let items = p.n_tokens * p.n_kv_heads * chunks;
            let need = kernels::HEADS_PER_ITEM * max_keys;
            if threads[0].scores.len() < need {
                return Err(BackendError::ScratchTooSmall {
                    op: "attention",
                    need,
                    have: threads[0].scores.len(),
                });
            }
            let out = DisjointMut::new(&mut out[..q_len]);
            return parallel(
                &self.pool,
                threads,
                p.n_tokens * p.n_heads * max_keys * hd * 2,
                &|i, parts, s| {
                    for item in split(items, parts, i) {
                        let (t, rest) = (
                            item / (p.n_kv_heads * chunks),
                            item % (p.n_kv_heads * chunks),
                        );
                        let (kv, c) = (rest / chunks, rest % chunks);
                        let h0 = kv * group + c * kernels::HEADS_PER_ITEM;
                        let g = kernels::HEADS_PER_ITEM.min(group - c * kernels::HEADS_PER_ITEM);
                        // SAFETY: items are split disjointly among parts and
                        // each owns the outputs of its own `g` heads.
                        let o = unsafe { out.range((t * p.n_heads + h0) * hd, g * hd) };
                        kernels::attend_heads(isa, &inputs, t, h0, g, &mut s.scores, o);
                    }
                },
            );
        }
        let items = p.n_tokens * p.n_heads;
        let out = DisjointMut::new(&mut out[..q_len]);
        parallel(
            &self.pool,
            threads,
            items * max_keys * hd * 2,
            &|i, parts, s| {
                let range = split(items, parts, i);
                for item in range {
                    // SAFETY: items are split disjointly among parts and each
                    // item owns its own `head_dim` output slice.
                    let o = unsafe { out.range(item * hd, hd) };
                    let (t, h) = (item / p.n_heads, item % p.n_heads);
                    if llama_cpp {
                        inputs.attend_ggml(t, h, &mut s.scores, &mut s.q16, o);
                    } else if fast {
                        kernels::attend(isa, &inputs, t, h, &mut s.scores, o);
                    } else {
                        inputs.attend(t, h, &mut s.scores, o);
                    }
                }
            },
        )
    }

    fn attends_parts(&self) -> bool {
        true
    }

    fn attention_parts(
        &mut self,
        q: &CpuBuf,
        parts: &[AttentionPart<'_, CpuBuf>],
        sinks: Option<&CpuVector>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        const OP: &str = "attention_parts";
        let q = q.f32s(OP, "q")?;
        let out = out.f32s_mut(OP, "out")?;
        let Some(first) = parts.first().map(|p| p.params) else {
            return Ok(());
        };
        let (nh, nkv, hd) = (first.n_heads, first.n_kv_heads, first.head_dim);
        let (fast, isa) = (self.numerics == Numerics::Fast, self.isa);
        // Items of one query head, or (fast numerics) of up to
        // HEADS_PER_ITEM heads sharing a KV head, loading each key and
        // value once for them (the same bits per head): with several
        // parts there are items enough for every thread even when each
        // part is one decoding token.
        let heads_per_item = |p: &AttentionParams| {
            if fast && kernels::attends_heads_in_parts(isa, p) {
                kernels::HEADS_PER_ITEM
            } else {
                1
            }
        };
        let items_per_token = |p: &AttentionParams| {
            let g = heads_per_item(p);
            p.n_kv_heads * (p.n_heads / p.n_kv_heads).div_ceil(g)
        };
        let (mut rows, mut items, mut need, mut work) = (0, 0, 0, 0);
        for part in parts {
            let p = &part.params;
            if (p.n_heads, p.n_kv_heads, p.head_dim) != (nh, nkv, hd) {
                return Err(BackendError::Shape {
                    op: OP,
                    detail: format!(
                        "a part of {} heads over {} kv heads of {} dims among parts of \
                         {nh} over {nkv} of {hd}",
                        p.n_heads, p.n_kv_heads, p.head_dim
                    ),
                });
            }
            if p.n_tokens == 0 {
                continue;
            }
            let keys = p.check()?;
            let cache_len = p.capacity * nkv * hd;
            check_len(
                OP,
                "k_cache",
                part.k_cache.f32s(OP, "k_cache")?.len(),
                cache_len,
            )?;
            check_len(
                OP,
                "v_cache",
                part.v_cache.f32s(OP, "v_cache")?.len(),
                cache_len,
            )?;
            need = need.max(heads_per_item(p) * keys);
            rows += p.n_tokens;
            items += p.n_tokens * items_per_token(p);
            work += p.n_tokens * nh * keys * hd * 2;
        }
        let q_len = rows * nh * hd;
        check_len(OP, "q", q.len(), q_len)?;
        check_len(OP, "out", out.len(), q_len)?;
        if let Some(s) = sinks {
            check_len(OP, "sinks", s.data.len(), nh)?;
        }
        let llama_cpp = self.llama_cpp();
        let StreamScratch { threads, .. } = &mut self.scratch;
        if threads[0].scores.len() < need {
            return Err(BackendError::ScratchTooSmall {
                op: OP,
                need,
                have: threads[0].scores.len(),
            });
        }
        if llama_cpp && threads[0].q16.len() < hd {
            return Err(BackendError::ScratchTooSmall {
                op: OP,
                need: hd,
                have: threads[0].q16.len(),
            });
        }
        let sinks = sinks.map(|s| s.data.as_slice());
        let out = DisjointMut::new(&mut out[..q_len]);
        parallel(&self.pool, threads, work, &|i, n_parts, s| {
            let range = split(items, n_parts, i);
            // Walk the parts, computing the items of this share.
            let (mut row0, mut item0) = (0, 0);
            for part in parts {
                let p = &part.params;
                let per = items_per_token(p);
                let (lo, hi) = (item0, item0 + p.n_tokens * per);
                let first_row = row0;
                row0 += p.n_tokens;
                item0 = hi;
                if hi <= range.start || lo >= range.end {
                    continue;
                }
                // Checked above; a failure here would be a broken invariant.
                let (Ok(k_cache), Ok(v_cache)) = (
                    part.k_cache.f32s(OP, "k_cache"),
                    part.v_cache.f32s(OP, "v_cache"),
                ) else {
                    continue;
                };
                let inputs = AttentionInputs {
                    q: &q[first_row * nh * hd..row0 * nh * hd],
                    k_cache,
                    v_cache,
                    params: p,
                    sinks,
                };
                let g_max = heads_per_item(p);
                for item in range.start.max(lo)..range.end.min(hi) {
                    let (t, rest) = ((item - lo) / per, (item - lo) % per);
                    let at = (first_row + t) * nh * hd;
                    if g_max > 1 {
                        let group = nh / nkv;
                        let chunks = group.div_ceil(g_max);
                        let (kv, c) = (rest / chunks, rest % chunks);
                        let h0 = kv * group + c * g_max;
                        let g = g_max.min(group - c * g_max);
                        // SAFETY: items are split disjointly among shares
                        // and each owns the outputs of its own `g` heads.
                        let o = unsafe { out.range(at + h0 * hd, g * hd) };
                        kernels::attend_heads(isa, &inputs, t, h0, g, &mut s.scores, o);
                    } else {
                        // SAFETY: as above, one head's `head_dim` outputs.
                        let o = unsafe { out.range(at + rest * hd, hd) };
                        if llama_cpp {
                            inputs.attend_ggml(t, rest, &mut s.scores, &mut s.q16, o);
                        } else if fast {
                            kernels::attend(isa, &inputs, t, rest, &mut s.scores, o);
                        } else {
                            inputs.attend(t, rest, &mut s.scores, o);
                        }
                    }
                }
            }
        })
    }

    fn glu(
        &mut self,
        gate: &mut CpuBuf,
        up: &CpuBuf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError> {
        self.glu_slices(
            gate.f32s_mut("glu", "gate")?,
            up.f32s("glu", "up")?,
            len,
            act,
        )
    }

    fn add(&mut self, dst: &mut CpuBuf, src: &CpuBuf, len: usize) -> Result<(), BackendError> {
        let dst = dst.f32s_mut("add", "dst")?;
        let src = src.f32s("add", "src")?;
        check_len("add", "dst", dst.len(), len)?;
        check_len("add", "src", src.len(), len)?;
        for (d, s) in dst[..len].iter_mut().zip(&src[..len]) {
            *d += s;
        }
        Ok(())
    }

    fn adjust_projection(
        &mut self,
        x: &mut CpuBuf,
        n: usize,
        u: &CpuVector,
        alpha: f32,
        beta: f32,
    ) -> Result<(), BackendError> {
        let x = x.f32s_mut("adjust_projection", "x")?;
        let d = u.data.len();
        check_len("adjust_projection", "x", x.len(), n * d)?;
        if d == 0 {
            return Ok(());
        }
        elementwise::adjust_projection(&mut x[..n * d], &u.data, alpha, beta);
        Ok(())
    }

    fn scale(&mut self, x: &mut CpuBuf, len: usize, s: f32) -> Result<(), BackendError> {
        let x = x.f32s_mut("scale", "x")?;
        check_len("scale", "x", x.len(), len)?;
        x[..len].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn mul_sigmoid(
        &mut self,
        x: &mut CpuBuf,
        gate: &CpuBuf,
        len: usize,
    ) -> Result<(), BackendError> {
        let x = x.f32s_mut("mul_sigmoid", "x")?;
        let gate = gate.f32s("mul_sigmoid", "gate")?;
        check_len("mul_sigmoid", "x", x.len(), len)?;
        check_len("mul_sigmoid", "gate", gate.len(), len)?;
        elementwise::mul_sigmoid(&mut x[..len], &gate[..len]);
        Ok(())
    }

    fn mul_sigmoid_rows(
        &mut self,
        x: &mut CpuBuf,
        gate: &CpuBuf,
        rows: usize,
        dim: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "mul_sigmoid_rows";
        let x = x.f32s_mut(OP, "x")?;
        let gate = gate.f32s(OP, "gate")?;
        check_len(OP, "x", x.len(), rows * dim)?;
        check_len(OP, "gate", gate.len(), rows)?;
        if dim > 0 {
            for (row, &g) in x[..rows * dim].chunks_exact_mut(dim).zip(gate) {
                let s = elementwise::sigmoid(g);
                row.iter_mut().for_each(|v| *v *= s);
            }
        }
        Ok(())
    }

    fn causal_conv1d_silu(
        &mut self,
        x: &CpuBuf,
        state: &mut CpuBuf,
        weight: &CpuVector,
        params: &ConvParams,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        const OP: &str = "causal_conv1d_silu";
        let x = x.f32s(OP, "x")?;
        let state = state.f32s_mut(OP, "state")?;
        let out = out.f32s_mut(OP, "out")?;
        params.check(x.len(), state.len(), weight.data.len(), out.len())?;
        delta_net::causal_conv1d_silu(x, state, &weight.data, params, out);
        Ok(())
    }

    fn gated_delta_rule(
        &mut self,
        input: DeltaNetInput<'_, CpuDevice>,
        params: &DeltaNetParams,
        state: &mut CpuBuf,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        const OP: &str = "gated_delta_rule";
        let state = state.f32s_mut(OP, "state")?;
        let out = out.f32s_mut(OP, "out")?;
        params.check(&DeltaNetLens {
            qkv: input.qkv.len(),
            alpha: input.alpha.len(),
            beta: input.beta.len(),
            a_log: input.a_log.data.len(),
            dt_bias: input.dt_bias.data.len(),
            state: state.len(),
            out: out.len(),
        })?;
        let (hv, dk, dv) = (params.v_heads, params.k_head_dim, params.v_head_dim);
        let StreamScratch { threads, .. } = &mut self.scratch;
        let have = threads.first().map_or(0, |s| s.delta.head_dim());
        if have < dk.max(dv) {
            return Err(BackendError::ScratchTooSmall {
                op: OP,
                need: dk.max(dv),
                have,
            });
        }
        let inputs = delta_net::Inputs {
            qkv: input.qkv.f32s(OP, "qkv")?,
            alpha: input.alpha.f32s(OP, "alpha")?,
            beta: input.beta.f32s(OP, "beta")?,
            a_log: &input.a_log.data,
            dt_bias: &input.dt_bias.data,
        };
        let isa = self.isa;
        let state = DisjointMut::new(&mut state[..params.state_len()]);
        let out = DisjointMut::new(&mut out[..params.n_tokens * hv * dv]);
        let work = 4 * params.n_tokens * hv * dk * dv;
        parallel(&self.pool, threads, work, &|part, parts, s| {
            for h in split(hv, parts, part) {
                // SAFETY: `split` gives every part its own value heads, and
                // a head's state and outputs are its own.
                unsafe {
                    delta_net::gated_delta_rule_head(
                        isa,
                        &inputs,
                        params,
                        h,
                        &state,
                        &out,
                        &mut s.delta,
                    )
                };
            }
        })
    }

    fn softcap(&mut self, x: &mut CpuBuf, len: usize, cap: f32) -> Result<(), BackendError> {
        let llama_cpp = self.llama_cpp();
        let x = x.f32s_mut("softcap", "x")?;
        check_len("softcap", "x", x.len(), len)?;
        if llama_cpp {
            ggml::ops::softcap(&mut x[..len], cap);
        } else {
            elementwise::softcap(&mut x[..len], cap);
        }
        Ok(())
    }

    fn route(
        &mut self,
        logits: &CpuBuf,
        n_tokens: usize,
        router: &RouterSpec,
        tables: RouterTables<'_, CpuVector>,
        out: &mut CpuRoutes,
    ) -> Result<(), BackendError> {
        let (e, k) = (router.num_experts(), router.top_k());
        let logits = logits.f32s("route", "logits")?;
        check_len("route", "logits", logits.len(), n_tokens * e)?;
        if routes_for("route", out, n_tokens)? != k {
            return Err(shape_err(
                "route",
                format!("routes of {} per token for a top-{k} router", out.top_k),
            ));
        }
        let tables = RouterTables {
            correction: tables.correction.map(|v| v.data.as_slice()),
            expert_scale: tables.expert_scale.map(|v| v.data.as_slice()),
        };
        for t in 0..n_tokens {
            route_token(
                router,
                &mut self.scratch.router,
                &logits[t * e..(t + 1) * e],
                tables,
                &mut out.routes[t * k..(t + 1) * k],
            )?;
        }
        Ok(())
    }

    fn moe_experts(
        &mut self,
        input: MoeInput<'_, CpuDevice>,
        scratch: &mut MoeScratch<CpuBuf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError> {
        moe::moe_experts(self, input, scratch, only)
    }

    fn moe_intermediate(
        &mut self,
        input: MoeInput<'_, CpuDevice>,
        scratch: &mut MoeScratch<CpuBuf>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        moe::moe_intermediate(self, input, scratch, out)
    }

    fn moe_combine(
        &mut self,
        n_tokens: usize,
        hidden: usize,
        routes: &CpuRoutes,
        scratch: &MoeScratch<CpuBuf>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        moe::moe_combine(n_tokens, hidden, routes, scratch, out)
    }
}
