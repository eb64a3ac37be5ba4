//! Rotary embeddings, KV-cache writes and attention on a [`CudaStream`]:
//! `rope` (HF `apply_rotary_pos_emb`, NeoX or interleaved pairs), the
//! cache writes of a step's keys and values (f32 or f16 rows), and
//! softmax attention over the cache (`kernels/attention.cu`: a block per
//! head for prefill, its keys a chunk at a time past the shared memory of
//! their scores, flash-decoding splits over the keys for one token; in
//! fast numerics a batch on the tensor cores, `kernels/attention_tc.cu`,
//! and one token over a long cache too, `kernels/attention_dec.cu`),
//! with the rope and writes of one position joined into one launch where
//! they follow each other (`crate::fusion`).

use super::{dtype_err, shape, CudaStream, Q8Regions};
use crate::fusion::{self, Pending, RopeKvLaunch};
use crate::kernels::{self, args, launch, AttnParams, RopeParams, SplitForm};
use crate::types::{CudaBuf, CudaVector};
use turbospark_backend::{
    check_len, check_rope, AttentionParams, BackendError, DType, Numerics, RopeTable,
};
use turbospark_core::arch::RopeKind;

/// Threads of an attention block.
const ATTN_THREADS: u32 = 128;

/// Query heads whose split-attention partials a stream holds: a layer's
/// heads times their width is at most the widest matrix input (its o
/// projection's), or 64 heads of the widest head, and the split kernels'
/// heads are at least 64 wide.
pub(super) fn decode_heads(widest: usize, max_head_dim: usize) -> usize {
    widest.max(64 * max_head_dim) / 64
}

/// Bytes of [`CudaStream`]'s `decode_split`: the tickets, then the most
/// splits' partials (`head_dim + 2` floats) of every head that a split
/// kernel makes (the tensor-core one only in fast numerics).
pub(super) fn decode_split_bytes(widest: usize, max_head_dim: usize, numerics: Numerics) -> usize {
    let heads = decode_heads(widest, max_head_dim);
    let width = widest.max(64 * max_head_dim);
    let splits = match numerics {
        Numerics::Fast => kernels::DECODE_MAX_SPLITS.max(kernels::DECODE_TC_MAX_SPLITS),
        _ => kernels::DECODE_MAX_SPLITS,
    };
    (heads * 4).next_multiple_of(16) + splits * (width + 2 * heads) * 4
}

impl CudaStream {
    pub(super) fn enqueue_rope(
        &mut self,
        x: &mut CudaBuf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError> {
        check_rope(table, head_dim)?;
        let pairs = table.pairs();
        if pairs > kernels::MAX_ROPE_PAIRS {
            return Err(BackendError::ScratchTooSmall {
                op: "rope",
                need: pairs,
                have: kernels::MAX_ROPE_PAIRS,
            });
        }
        let xp = x.f32_ptr("rope", "x", n_tokens * n_heads * head_dim)?;
        let mut p = RopeParams {
            inv_freq: [0.0; kernels::MAX_ROPE_PAIRS],
            attention_factor: table.attention_factor,
            pairs: pairs as i32,
            kind: match table.kind {
                RopeKind::Neox => 0,
                RopeKind::Interleaved => 1,
            },
        };
        p.inv_freq[..pairs].copy_from_slice(&table.inv_freq);
        // Held back: the rope of k joins q's, and the cache writes that
        // follow join both (crate::fusion).
        let l = RopeKvLaunch::rope(
            xp,
            n_heads,
            n_tokens,
            head_dim,
            first_pos,
            p,
            self.step_ptr(),
        );
        self.quantized.set(None);
        self.bind_holding("rope")?;
        // (One token's q, k and v products held back take their ropes and
        // cache writes into their own launch: fusion::qkv_rope_starts.)
        let joined = match self.pending.get() {
            Some(Pending::RopeKv(mut held)) => held.join_rope(&l).then_some(Pending::RopeKv(held)),
            Some(Pending::QkvRope(g, mut held)) => {
                held.join_rope(&l).then_some(Pending::QkvRope(g, held))
            }
            Some(Pending::Group(g)) if fusion::qkv_rope_starts(&self.k, &g, &l) => {
                Some(Pending::QkvRope(g, l))
            }
            _ => None,
        };
        if let Some(p) = joined {
            self.pending.set(Some(p));
            return Ok(());
        }
        self.hold(Pending::RopeKv(l))
    }

    pub(super) fn enqueue_kv_write(
        &mut self,
        cache: &mut CudaBuf,
        src: &CudaBuf,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
    ) -> Result<(), BackendError> {
        if n_tokens > capacity {
            return Err(shape(
                "kv_write",
                format!("{n_tokens} rows into a {capacity}-row cache"),
            ));
        }
        let sp = src.f32_ptr("kv_write", "src", n_tokens * row_len)?;
        check_len("kv_write", "cache", cache.len, capacity * row_len)?;
        let f = match cache.dtype {
            DType::F32 => &self.k.kv_write_f32,
            DType::F16 => &self.k.kv_write_f16,
            other => return Err(dtype_err("kv_write", "cache", DType::F16, other)),
        };
        let held = match self.pending.get() {
            Some(Pending::RopeKv(held)) => Some((None, held)),
            Some(Pending::QkvRope(g, held)) => Some((Some(g), held)),
            _ => None,
        };
        if let Some((products, mut held)) = held {
            let f16 = cache.dtype == DType::F16;
            let step = self.step_ptr();
            if held.join_write(
                cache.mem.ptr,
                f16,
                sp,
                n_tokens,
                row_len,
                first_pos,
                capacity,
                step,
            ) {
                self.quantized.set(None);
                self.bind_holding("kv_write")?;
                self.pending.set(Some(match products {
                    Some(g) => Pending::QkvRope(g, held),
                    None => Pending::RopeKv(held),
                }));
                return Ok(());
            }
        }
        let (n, r, fp, cap) = (
            n_tokens as i32,
            row_len as i32,
            first_pos as i32,
            capacity as i32,
        );
        let step = self.step_ptr();
        self.elementwise(
            "kv_write",
            f,
            n_tokens * row_len,
            &mut args![cache.mem.ptr, sp, n, r, fp, cap, step],
        )
    }

    pub(super) fn enqueue_attention(
        &mut self,
        q: &CudaBuf,
        k_cache: &CudaBuf,
        v_cache: &CudaBuf,
        p: &AttentionParams,
        sinks: Option<&CudaVector>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if p.n_tokens == 0 {
            return Ok(());
        }
        let keys_seen = p.check()?;
        let q_len = p.n_tokens * p.n_heads * p.head_dim;
        let cache_len = p.capacity * p.n_kv_heads * p.head_dim;
        let qp = q.f32_ptr("attention", "q", q_len)?;
        let op = out.f32_ptr("attention", "out", q_len)?;
        if k_cache.dtype != v_cache.dtype {
            return Err(dtype_err(
                "attention",
                "v_cache",
                k_cache.dtype,
                v_cache.dtype,
            ));
        }
        check_len("attention", "k_cache", k_cache.len, cache_len)?;
        check_len("attention", "v_cache", v_cache.len, cache_len)?;
        if let Some(s) = sinks {
            check_len("attention", "sinks", s.len, p.n_heads)?;
        }
        // A recorded step is replayed at later positions: room for every
        // key the cache can hold.
        let max_keys = if self.recording {
            p.capacity
        } else {
            keys_seen
        };
        let group = p.n_heads / p.n_kv_heads.max(1);
        // One token over an f16 cache: split over the keys (no shared
        // memory per key), a block per KV head and split serving the
        // group's query heads; over long caches in fast numerics on the
        // tensor cores, each key read once for the group.
        let tc_splits = self
            .decode_attention
            .tc_splits(p.capacity, p.window, p.n_kv_heads)
            .filter(|_| self.numerics == Numerics::Fast);
        let form = self.decode_attention.split_form_for(p.head_dim);
        let (split_kernel, splits, split_threads, split_smem) = match tc_splits {
            Some(s) => (
                match p.head_dim {
                    64 => Some(&self.k.attention_decode_tc_f16_64),
                    128 => Some(&self.k.attention_decode_tc_f16_128),
                    _ => None,
                },
                s,
                kernels::DECODE_TC_THREADS,
                0,
            ),
            None => (
                match (p.head_dim, form) {
                    (64, SplitForm::Staged) => Some(&self.k.attention_decode_staged_f16_64),
                    (128, SplitForm::Staged) => Some(&self.k.attention_decode_staged_f16_128),
                    (64, _) => Some(&self.k.attention_decode_f16_64),
                    (128, _) => Some(&self.k.attention_decode_f16_128),
                    _ => None,
                },
                kernels::decode_splits(p.capacity, p.window, self.decode_split_keys),
                kernels::DECODE_THREADS,
                if form == SplitForm::Staged {
                    kernels::DECODE_STAGE_BYTES
                } else {
                    0
                },
            ),
        };
        let tickets = (self.decode_heads * 4).next_multiple_of(16);
        let split_kernel = split_kernel.filter(|_| {
            p.n_tokens == 1
                && k_cache.dtype == DType::F16
                && (1..=kernels::ATTN_MAX_GROUP).contains(&group)
                && p.n_kv_heads <= self.decode_heads
                && tickets + splits * p.n_heads * (p.head_dim + 2) * 4 <= self.decode_split.bytes
        });
        // A batch on the tensor cores where asked for and it fits (heads 64
        // or 128 wide): a block per KV head and 16 tokens, a warp per query
        // head of the group, the keys walked in tiles with a running softmax.
        let prefill_tc = match p.head_dim {
            64 => Some(&self.k.attention_prefill_tc_f16_64),
            128 => Some(&self.k.attention_prefill_tc_f16_128),
            _ => None,
        }
        .filter(|_| {
            self.prefill_attention_tc
                && !self.recording
                && p.n_tokens > 1
                && self.numerics == Numerics::Fast
                && k_cache.dtype == DType::F16
                && (1..=kernels::PREFILL_TC_MAX_GROUP).contains(&group)
                && p.n_heads == group * p.n_kv_heads
        });
        // The scalar kernels keep a score a key in shared memory (about 57k
        // keys on an H100 or H200); past that, attention_long_* takes the
        // keys a chunk at a time, to the same bits.
        let mut smem = (p.head_dim + max_keys) * 4;
        let long = smem > self.k.dynamic_smem || self.attention_long_always;
        if long && split_kernel.is_none() && p.head_dim > kernels::ATTN_LONG_MAX_DIM {
            return Err(shape(
                "attention",
                format!(
                    "{max_keys} keys of heads {} wide: past the shared memory of the scalar \
                     kernels, whose chunked form takes heads up to {} wide",
                    p.head_dim,
                    kernels::ATTN_LONG_MAX_DIM
                ),
            ));
        }
        let f = match (k_cache.dtype, long) {
            (DType::F32, false) => &self.k.attention_f32,
            (DType::F16, false) => &self.k.attention_f16,
            (DType::F32, true) => &self.k.attention_long_f32,
            (DType::F16, true) => &self.k.attention_long_f16,
            (other, _) => return Err(dtype_err("attention", "k_cache", DType::F16, other)),
        };
        if long {
            smem = (p.head_dim + kernels::ATTN_LONG_CHUNK) * 4;
        }
        let params = AttnParams {
            first_pos: p.first_pos as i32,
            n_heads: p.n_heads as i32,
            n_kv_heads: p.n_kv_heads as i32,
            head_dim: p.head_dim as i32,
            capacity: p.capacity as i32,
            window: p.window.map_or(0, |w| w as i32),
            scale: p.scale,
            softcap: p.softcap.unwrap_or(0.0),
            has_sinks: sinks.is_some() as i32,
        };
        let sp = sinks.map_or(0, |s| s.mem.ptr);
        let step = self.step_ptr();
        self.bind("attention")?;
        if let Some(f) = prefill_tc {
            let nt = p.n_tokens as i32;
            let grid = (
                p.n_kv_heads as u32,
                p.n_tokens.div_ceil(kernels::PREFILL_TC_TOKENS) as u32,
                1,
            );
            return launch(
                "attention",
                f,
                self.raw(),
                grid,
                (32 * group) as u32,
                0,
                &mut args![qp, k_cache.mem.ptr, v_cache.mem.ptr, params, nt, sp, op],
            );
        }
        // Prefill of grouped-query attention: a block per KV head and
        // token serves the group's query heads (each key read once).
        let sets = ((ATTN_THREADS as usize) / p.head_dim.max(1)).clamp(1, group.max(1));
        let group_smem = (group * p.head_dim + group * keys_seen) * 4;
        if !self.recording
            && p.n_tokens > 1
            && (2..=kernels::ATTN_MAX_GROUP).contains(&group)
            && p.head_dim % 4 == 0
            && (ATTN_THREADS as usize) % p.head_dim == 0
            && group % sets == 0
            && group_smem <= self.k.dynamic_smem
        {
            let f = match k_cache.dtype {
                DType::F32 => &self.k.attention_group_f32,
                _ => &self.k.attention_group_f16,
            };
            return launch(
                "attention",
                f,
                self.raw(),
                (p.n_kv_heads as u32, p.n_tokens as u32, 1),
                ATTN_THREADS,
                group_smem as u32,
                &mut args![qp, k_cache.mem.ptr, v_cache.mem.ptr, params, sp, op],
            );
        }
        // In fast numerics the output is also quantized for the product
        // that reads it next (the o projection: Q8_0's order), into the
        // scratch where that product's `matmul_q8` looks for it.
        // (Only into the scratch as it is: a larger one is made by the
        // product, which then quantizes for itself.)
        let (mut oq, mut oqd) = (0u64, 0u64);
        let mut r = Q8Regions::new(q_len, 0);
        if self.fuse.attention
            && self.numerics == Numerics::Fast
            && p.head_dim % 32 == 0
            && r.bytes <= self.q8.bytes
        {
            r.rebase(self.q8.ptr);
            (oq, oqd) = (r.xq, r.xd);
        }
        match split_kernel {
            Some(f) => {
                let (tp, pp) = (
                    self.decode_split.ptr,
                    self.decode_split.ptr + tickets as u64,
                );
                launch(
                    "attention",
                    f,
                    self.raw(),
                    (p.n_kv_heads as u32, splits as u32, 1),
                    split_threads,
                    split_smem,
                    &mut args![
                        qp,
                        k_cache.mem.ptr,
                        v_cache.mem.ptr,
                        params,
                        sp,
                        op,
                        step,
                        oq,
                        oqd,
                        pp,
                        tp
                    ],
                )?
            }
            _ => {
                // The long form takes its chunk after the parameters.
                let (kp, vp) = (k_cache.mem.ptr, v_cache.mem.ptr);
                let chunk = kernels::ATTN_LONG_CHUNK as i32;
                let long_args = &mut args![qp, kp, vp, params, chunk, sp, op, step, oq, oqd];
                let one_pass_args = &mut args![qp, kp, vp, params, sp, op, step, oq, oqd];
                let args: &mut [_] = if long { long_args } else { one_pass_args };
                launch(
                    "attention",
                    f,
                    self.raw(),
                    (p.n_heads as u32, p.n_tokens as u32, 1),
                    ATTN_THREADS,
                    smem as u32,
                    args,
                )?
            }
        }
        if oq != 0 {
            self.quantized.set(Some((op, q_len, 0)));
        }
        Ok(())
    }
}
