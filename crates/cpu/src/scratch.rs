//! The scratch a CPU stream owns, and the sizes it is fitted to.
//!
//! A stream is created after the weights it will multiply by are uploaded:
//! the device records the widest matrix of each format
//! ([`UploadNeeds`]), and the stream fits its per-thread tiles and its
//! activation-quantization buffers to those and to the session's
//! [`Limits`]. Ops check their scratch and fail with
//! [`BackendError::ScratchTooSmall`](turbospark_backend::BackendError)
//! instead of growing it.

use crate::delta_net::DeltaScratch;
use crate::ggml::ActScratch;
use crate::matmul::{CodeTile, TILE};
use turbospark_backend::{BackendError, Limits, Numerics, RouterScratch};
use turbospark_core::QuantFormat;

/// The widest matrix uploaded in each format.
#[derive(Debug, Clone, Default)]
pub(crate) struct UploadNeeds {
    widest: Vec<(QuantFormat, usize)>,
}

impl UploadNeeds {
    pub(crate) fn record(&mut self, format: QuantFormat, cols: usize) {
        match self.widest.iter_mut().find(|(f, _)| *f == format) {
            Some((_, c)) => *c = (*c).max(cols),
            None => self.widest.push((format, cols)),
        }
    }

    fn max_cols(&self) -> usize {
        self.widest.iter().map(|&(_, c)| c).max().unwrap_or(0)
    }
}

/// Scratch owned by one pool thread of one stream.
#[derive(Default)]
pub(crate) struct ThreadScratch {
    /// `TILE` dequantized weight rows.
    pub tile: Vec<f32>,
    /// `TILE` weight rows unpacked to 8-bit codes (llama.cpp numerics).
    pub codes: CodeTile,
    /// One query head rounded to f16 (llama.cpp numerics).
    pub q16: Vec<f32>,
    /// Attention scores of one query.
    pub scores: Vec<f32>,
    /// cos/sin of one token's rope pairs.
    pub trig: Vec<f32>,
    /// One head of the gated delta rule.
    pub delta: DeltaScratch,
    /// The first error a job met on this thread.
    pub error: Option<BackendError>,
}

/// Everything a stream computes in besides its arguments.
pub(crate) struct StreamScratch {
    /// One per pool thread.
    pub threads: Vec<ThreadScratch>,
    /// Quantized activations of the current matmul (llama.cpp numerics).
    pub act: ActScratch,
    /// Quantized activations of the current matmul (fast numerics).
    pub fast_act: crate::kernels::ActScratch,
    /// Router values, scores and choices of one token.
    pub router: RouterScratch,
    /// cos/sin of the rope pairs at recent positions.
    pub rope_trig: crate::rope::TrigCache,
}

impl StreamScratch {
    pub(crate) fn new(
        threads: usize,
        numerics: Numerics,
        needs: &UploadNeeds,
        limits: &Limits,
    ) -> StreamScratch {
        let llama_cpp = numerics == Numerics::LlamaCpp;
        let fast = numerics == Numerics::Fast;
        let cols = needs.max_cols();
        let threads = (0..threads.max(1))
            .map(|_| {
                let mut s = ThreadScratch {
                    tile: vec![0.0; TILE * cols],
                    // Fast numerics attends several heads per item.
                    scores: vec![
                        0.0;
                        limits.max_keys
                            * if fast {
                                crate::kernels::HEADS_PER_ITEM
                            } else {
                                1
                            }
                    ],
                    trig: vec![0.0; limits.max_head_dim],
                    delta: DeltaScratch::new(limits.max_delta_head_dim),
                    ..ThreadScratch::default()
                };
                if llama_cpp {
                    s.q16 = vec![0.0; limits.max_head_dim];
                    for &(format, cols) in &needs.widest {
                        if format.block_elems() > 1 {
                            s.codes.fit(format, cols);
                        }
                    }
                }
                s
            })
            .collect();
        let mut act = ActScratch::default();
        if llama_cpp {
            for &(format, cols) in &needs.widest {
                act.fit_matrix(format, cols);
            }
            act.fit_tokens(limits.max_tokens);
        }
        let mut fast_act = crate::kernels::ActScratch::default();
        if fast {
            fast_act.fit_matrix(cols);
            fast_act.fit_tokens(limits.max_tokens);
        }
        StreamScratch {
            threads,
            act,
            fast_act,
            router: RouterScratch::new(limits.max_experts),
            rope_trig: crate::rope::TrigCache::new(limits.max_head_dim / 2),
        }
    }
}
