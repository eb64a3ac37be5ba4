//! The generic decoder: one pass over a batch of tokens, for every family,
//! driven by the [`ArchSpec`] alone (the math is in `turbospark_core::arch`;
//! the normative references are the HF `modeling_<type>.py` files of
//! transformers 5.24.0: llama, qwen2, gemma3, muse_glimmer, mixtral,
//! qwen3_moe, gpt_oss, glm4_moe, gemma4).
//!
//! ```text
//! h = embed(tokens) · embedding.scale ; h = embedding.norm(h)
//! per layer (head_dim and n_kv_heads are the layer's own):
//!   a = attn_norm(h)
//!   q, k = a·Wq (+b), a·Wk (+b) ; v = a·Wv (+b), or k itself (value_from_key)
//!   q, k, v = per-head q/k/v norms ; q, k = rope(q, k)
//!   cache k, v ; o = attention(q, cache)          (window, sinks, softcap, GQA)
//!   o ⊙= sigmoid(a·Wgate)                          (output gate)
//!   h += attn_post_norm(o·Wo (+b))
//!   a = ffn_norm(h)
//!   dense layer: f = dense(a)
//!   MoE layer:   z = router(a), or (Gemma 4) router(rms(h) · router.scale · hidden^-½)
//!                x = a, or moe_input_norm(h) when the spec has one
//!                f = moe_post_norm(Σ_r w_r expert_r(x))
//!                    [+ shared(a)] [+ dense_branch_post_norm(dense(a))]
//!   h += ffn_post_norm(f)
//!   h ·= layer_output_scale                        (scales the residual too)
//! logits = softcap(multiplier · (output_norm(h) · W_out))   (W_out = token_embd if tied)
//! ```

use crate::experts::routed::RoutedInput;
use crate::router::RouterTables;
use crate::session::{RouterState, Session};
use crate::timing::Phase;
use crate::weights::{DenseWeights, FfnWeights, LayerWeights, MoeWeights};
use crate::EngineError;
use crate::Model;
use std::time::Instant;
use turbospark_backend::{AttentionParams, Backend, MoeScratch};
use turbospark_core::arch::{ArchSpec, FfnKind, LayerSpec, NormSpec};

/// Scratch activations of a session, `T = max_batch` rows each.
pub(crate) struct Buffers<B: Backend> {
    /// Residual stream `[T, hidden]`.
    h: B::Buf,
    /// Normed block input `[T, hidden]`.
    a: B::Buf,
    /// `[T, n_heads · head_dim]`
    q: B::Buf,
    /// `[T, n_kv_heads · head_dim]`
    k: B::Buf,
    v: B::Buf,
    /// Attention output `[T, n_heads · head_dim]`.
    att: B::Buf,
    /// Output-gate logits `[T, n_heads · head_dim]`.
    gate: Option<B::Buf>,
    /// Block output before the residual add `[T, hidden]`.
    o: B::Buf,
    /// Dense / shared MLP `[T, intermediate]`.
    mlp_gate: B::Buf,
    mlp_up: B::Buf,
    /// Second FFN branch (shared expert, parallel dense) `[T, hidden]`.
    branch: B::Buf,
    /// Router logits `[T, num_experts]`.
    router: Option<B::Buf>,
    /// Router or expert input taken from the residual stream under its own
    /// norm (Gemma 4) `[T, hidden]`.
    moe_in: Option<B::Buf>,
    moe: Option<MoeScratch<B::Buf>>,
    /// `[T, vocab]`
    logits: B::Buf,
}

fn max_over<'a>(layers: &'a [LayerSpec], f: impl Fn(&'a LayerSpec) -> usize) -> usize {
    layers.iter().map(f).max().unwrap_or(0)
}

impl<B: Backend> Buffers<B> {
    pub(crate) fn new(be: &B, spec: &ArchSpec, t: usize) -> Result<Self, EngineError> {
        let h = spec.hidden_size;
        let qd = max_over(&spec.layers, |l| spec.num_heads * l.head_dim);
        let kvd = max_over(&spec.layers, |l| l.num_kv_heads * l.head_dim);
        let any_dense = spec.layers.iter().any(|l| l.ffn == FfnKind::Dense)
            || spec.moe.as_ref().is_some_and(|m| m.parallel_dense);
        let inter = [
            if any_dense { spec.intermediate_size } else { 0 },
            spec.moe
                .as_ref()
                .and_then(|m| m.shared_intermediate)
                .unwrap_or(0),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let moe = spec
            .moe
            .as_ref()
            .map(|m| {
                Ok::<_, EngineError>(MoeScratch {
                    x: be.alloc(t * h)?,
                    gate: be.alloc(t * m.expert_intermediate)?,
                    up: be.alloc(t * m.expert_intermediate)?,
                    y: be.alloc(t * m.top_k * h)?,
                })
            })
            .transpose()?;
        Ok(Buffers {
            h: be.alloc(t * h)?,
            a: be.alloc(t * h)?,
            q: be.alloc(t * qd)?,
            k: be.alloc(t * kvd)?,
            v: be.alloc(t * kvd)?,
            att: be.alloc(t * qd)?,
            gate: spec
                .attention
                .output_gate
                .then(|| be.alloc(t * qd))
                .transpose()?,
            o: be.alloc(t * h)?,
            mlp_gate: be.alloc(t * inter)?,
            mlp_up: be.alloc(t * inter)?,
            branch: be.alloc(t * h)?,
            router: spec
                .moe
                .as_ref()
                .map(|m| be.alloc(t * m.num_experts))
                .transpose()?,
            moe_in: spec.moe.as_ref().map(|_| be.alloc(t * h)).transpose()?,
            moe,
            logits: be.alloc(t * spec.vocab_size)?,
        })
    }
}

/// `out = down(act(gate·x) ⊙ up·x)` for `n` rows.
fn dense_mlp<B: Backend>(
    m: &Model<B>,
    w: &DenseWeights<B>,
    x: &B::Buf,
    n: usize,
    tmp_gate: &mut B::Buf,
    tmp_up: &mut B::Buf,
    out: &mut B::Buf,
) -> Result<(), EngineError> {
    let be = &m.backend;
    be.matmul(&w.gate, x, n, tmp_gate)?;
    be.matmul(&w.up, x, n, tmp_up)?;
    be.glu(tmp_gate, tmp_up, n * w.intermediate, m.spec.activation)?;
    be.matmul(&w.down, tmp_gate, n, out)?;
    Ok(())
}

fn add_bias<B: Backend>(
    be: &B,
    x: &mut B::Buf,
    bias: Option<&B::Vector>,
    n: usize,
) -> Result<(), EngineError> {
    if let Some(b) = bias {
        be.add_bias(x, b, n)?;
    }
    Ok(())
}

impl<B: Backend> Session<'_, B> {
    /// Runs one batch of at most `max_batch` tokens at `pos` (inputs already
    /// checked) and, if asked, writes the logits of `rows` rows starting at
    /// batch row `first` into `out`.
    pub(crate) fn run_chunk(
        &mut self,
        pos: usize,
        tokens: &[u32],
        head: Option<(usize, usize, &mut [f32])>,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let spec = &m.spec;
        let be = &m.backend;
        let n = tokens.len();
        let hidden = spec.hidden_size;
        let b = &mut self.bufs;

        let start = Instant::now();
        be.embed(&m.weights.token_embd, tokens, &mut b.h)?;
        if spec.embedding.scale != 1.0 {
            be.scale(&mut b.h, n * hidden, spec.embedding.scale)?;
        }
        if let Some(norm) = spec.embedding.norm {
            be.rms_norm(&mut b.h, n, hidden, norm, None)?;
        }
        let mut t = self.times.lap(Phase::Embed, start);
        for (l, lw) in m.weights.layers.iter().enumerate() {
            self.attention_block(l, lw, pos, n)?;
            t = self.times.lap(Phase::Attention, t);
            t = self.ffn_block(l, lw, n, t)?;
            if let Some(s) = lw.layer_output_scale {
                be.scale(&mut self.bufs.h, n * hidden, s)?;
            }
        }
        if let Some((first, rows, out)) = head {
            self.head(first, rows, out)?;
            self.times.lap(Phase::Head, t);
        }
        Ok(())
    }

    fn attention_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<B>,
        pos: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, be) = (&m.spec, &m.backend);
        let ls = &spec.layers[l];
        let (hidden, nh, nkv, hd) = (
            spec.hidden_size,
            spec.num_heads,
            ls.num_kv_heads,
            ls.head_dim,
        );
        let norms = &spec.norms;
        let b = &mut self.bufs;

        be.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        be.rms_norm(&mut b.a, n, hidden, norms.attn_input, lw.attn_norm.as_ref())?;
        be.matmul(&lw.attn_q, &b.a, n, &mut b.q)?;
        add_bias(be, &mut b.q, lw.attn_q_bias.as_ref(), n)?;
        be.matmul(&lw.attn_k, &b.a, n, &mut b.k)?;
        add_bias(be, &mut b.k, lw.attn_k_bias.as_ref(), n)?;
        match &lw.attn_v {
            Some(wv) => {
                be.matmul(wv, &b.a, n, &mut b.v)?;
                add_bias(be, &mut b.v, lw.attn_v_bias.as_ref(), n)?;
            }
            // Values are the key projection as it is before the k norm and rope.
            None => be.copy(&b.k, 0, &mut b.v, 0, n * nkv * hd)?,
        }
        if let Some(ns) = norms.q {
            be.rms_norm(&mut b.q, n * nh, hd, ns, lw.attn_q_norm.as_ref())?;
        }
        if let Some(ns) = norms.k {
            be.rms_norm(&mut b.k, n * nkv, hd, ns, lw.attn_k_norm.as_ref())?;
        }
        if let Some(ns) = norms.v {
            be.rms_norm(&mut b.v, n * nkv, hd, ns, lw.attn_v_norm.as_ref())?;
        }
        if let Some(rope) = &m.ropes[l] {
            be.rope(&mut b.q, n, nh, hd, pos, rope)?;
            be.rope(&mut b.k, n, nkv, hd, pos, rope)?;
        }
        let kv = &mut self.kv.layers[l];
        be.kv_write(&mut kv.k, &b.k, n, kv.row, pos, kv.capacity)?;
        be.kv_write(&mut kv.v, &b.v, n, kv.row, pos, kv.capacity)?;
        let params = AttentionParams {
            n_tokens: n,
            first_pos: pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            capacity: kv.capacity,
            window: ls.window,
            scale: spec.attention.scale,
            softcap: spec.attention.softcap,
        };
        be.attention(
            &b.q,
            &kv.k,
            &kv.v,
            &params,
            lw.attn_sinks.as_ref(),
            &mut b.att,
        )?;
        if let (Some(wg), Some(g)) = (&lw.attn_gate, b.gate.as_mut()) {
            be.matmul(wg, &b.a, n, g)?;
            be.mul_sigmoid(&mut b.att, g, n * nh * hd)?;
        }
        be.matmul(&lw.attn_output, &b.att, n, &mut b.o)?;
        add_bias(be, &mut b.o, lw.attn_output_bias.as_ref(), n)?;
        if let Some(ns) = norms.attn_post {
            be.rms_norm(&mut b.o, n, hidden, ns, lw.post_attention_norm.as_ref())?;
        }
        be.add(&mut b.h, &b.o, n * hidden)?;
        Ok(())
    }

    /// The FFN block of layer `l`; times its phases from `t` and returns
    /// the end of the last.
    fn ffn_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<B>,
        n: usize,
        t: Instant,
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let (spec, be) = (&m.spec, &m.backend);
        let hidden = spec.hidden_size;
        let b = &mut self.bufs;

        be.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        be.rms_norm(
            &mut b.a,
            n,
            hidden,
            spec.norms.ffn_input,
            lw.ffn_norm.as_ref(),
        )?;
        let (t, phase) = match &lw.ffn {
            FfnWeights::Dense(d) => {
                dense_mlp(m, d, &b.a, n, &mut b.mlp_gate, &mut b.mlp_up, &mut b.o)?;
                (t, Phase::DenseFfn)
            }
            FfnWeights::Moe(mw) => (self.moe_block(l, lw, mw, n, t)?, Phase::Experts),
        };
        let b = &mut self.bufs;
        if let Some(ns) = spec.norms.ffn_post {
            be.rms_norm(&mut b.o, n, hidden, ns, lw.post_ffw_norm.as_ref())?;
        }
        be.add(&mut b.h, &b.o, n * hidden)?;
        Ok(self.times.lap(phase, t))
    }

    /// The MoE part of a MoE layer's FFN: routed experts plus any shared or
    /// parallel dense branch, into `bufs.o`. `bufs.a` holds the FFN-normed
    /// input and `bufs.h` the residual stream entering the block. Times
    /// router, routed experts and dense branches from `t`; returns the end.
    fn moe_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<B>,
        mw: &MoeWeights<B>,
        n: usize,
        t: Instant,
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let (spec, be) = (&m.spec, &m.backend);
        let hidden = spec.hidden_size;
        let norms = &spec.norms;
        let b = &mut self.bufs;
        let (Some(router_buf), Some(scratch), Some(moe_in), Some(rs)) = (
            b.router.as_mut(),
            b.moe.as_mut(),
            b.moe_in.as_mut(),
            self.routing.as_mut(),
        ) else {
            return Err(EngineError::NotImplemented {
                feature: "a MoE layer in a spec without a MoE block",
            });
        };

        // Router. A router with its own input scale (Gemma 4) reads
        // `rms(h) · scale · hidden^-½` of the residual stream, with the
        // FFN norms' eps (HF: both are `rms_norm_eps`).
        match &mw.router_scale {
            Some(scale) => {
                be.copy(&b.h, 0, moe_in, 0, n * hidden)?;
                let ns = NormSpec::plain(norms.ffn_input.eps);
                be.rms_norm(moe_in, n, hidden, ns, Some(scale))?;
                be.scale(moe_in, n * hidden, (hidden as f64).powf(-0.5) as f32)?;
                be.matmul(&mw.router, moe_in, n, router_buf)?;
            }
            None => be.matmul(&mw.router, &b.a, n, router_buf)?,
        }
        add_bias(be, router_buf, mw.router_bias.as_ref(), n)?;
        let tables = RouterTables {
            correction: mw.exp_probs_b.as_deref(),
            expert_scale: mw.expert_scale.as_deref(),
        };
        let routes = route(be, rs, router_buf, tables, n)?;
        let t = self.times.lap(Phase::Router, t);

        // Routed experts, on the FFN-normed input or on their own norm of
        // the residual stream, wherever the store keeps them.
        let x = match norms.moe_input {
            Some(ns) => {
                be.copy(&b.h, 0, moe_in, 0, n * hidden)?;
                be.rms_norm(moe_in, n, hidden, ns, lw.pre_ffw_norm_2.as_ref())?;
                &*moe_in
            }
            None => &b.a,
        };
        self.experts.run(
            be,
            RoutedInput {
                layer: l,
                x,
                n_tokens: n,
                routes,
                held: &mw.experts,
                activation: spec.activation,
            },
            scratch,
            &mut b.o,
        )?;
        if let Some(ns) = norms.moe_post {
            be.rms_norm(&mut b.o, n, hidden, ns, lw.post_ffw_norm_2.as_ref())?;
        }
        let mut t = self.times.lap(Phase::Experts, t);

        // Always-on branches on the FFN-normed input.
        let branches = [
            (&mw.shared, None),
            (
                &mw.parallel_dense,
                norms
                    .dense_branch_post
                    .map(|ns| (ns, lw.post_ffw_norm_1.as_ref())),
            ),
        ];
        for (w, post) in branches {
            let Some(w) = w else { continue };
            dense_mlp(m, w, &b.a, n, &mut b.mlp_gate, &mut b.mlp_up, &mut b.branch)?;
            if let Some((ns, weight)) = post {
                be.rms_norm(&mut b.branch, n, hidden, ns, weight)?;
            }
            be.add(&mut b.o, &b.branch, n * hidden)?;
            t = self.times.lap(Phase::DenseFfn, t);
        }
        Ok(t)
    }

    /// Final norm, head, multiplier and soft-cap for batch rows
    /// `first .. first + rows`, read back into `out` (`[rows, vocab]`).
    fn head(&mut self, first: usize, rows: usize, out: &mut [f32]) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, be) = (&m.spec, &m.backend);
        let (hidden, vocab) = (spec.hidden_size, spec.vocab_size);
        let b = &mut self.bufs;
        be.copy(&b.h, first * hidden, &mut b.a, 0, rows * hidden)?;
        be.rms_norm(
            &mut b.a,
            rows,
            hidden,
            spec.norms.output,
            m.weights.output_norm.as_ref(),
        )?;
        let w_out = m.weights.output.as_ref().unwrap_or(&m.weights.token_embd);
        be.matmul(w_out, &b.a, rows, &mut b.logits)?;
        if spec.head.multiplier != 1.0 {
            be.scale(&mut b.logits, rows * vocab, spec.head.multiplier)?;
        }
        if let Some(cap) = spec.head.softcap {
            be.softcap(&mut b.logits, rows * vocab, cap)?;
        }
        be.read(&b.logits, &mut out[..rows * vocab])?;
        Ok(())
    }
}

/// Reads `n` tokens' router logits back and routes each token.
fn route<'r, B: Backend>(
    be: &B,
    rs: &'r mut RouterState,
    router_logits: &B::Buf,
    tables: RouterTables<'_>,
    n: usize,
) -> Result<&'r [turbospark_backend::Route], EngineError> {
    let e = rs.router.num_experts();
    let k = rs.router.top_k();
    let logits = &mut rs.logits[..n * e];
    be.read(router_logits, logits)?;
    for t in 0..n {
        rs.router.route(
            &logits[t * e..(t + 1) * e],
            tables,
            &mut rs.routes[t * k..(t + 1) * k],
        )?;
    }
    Ok(&rs.routes[..n * k])
}
