//! Which arithmetic a backend reproduces.
//!
//! The same model can be evaluated two ways that differ only in rounding:
//!
//! - [`Numerics::Exact`]: weights are dequantized exactly and every product
//!   and sum is taken in f32 (or wider) on unrounded activations. This is
//!   what HF transformers computes in f32, and what the HF-parity tests hold
//!   backends to.
//! - [`Numerics::LlamaCpp`]: the arithmetic of ggml's CPU backend as
//!   llama.cpp runs it with its defaults (f16 KV cache, flash attention
//!   off): activations are quantized to the weight's `vec_dot_type` (Q8_0,
//!   Q8_1, Q8_K; f16 or bf16 for float weights) and dotted in integers per
//!   block; K and V are stored as f16; `q·k` uses an f16 query and `p·V`
//!   f16 probabilities; GELU goes through ggml's f16 table. It exists to
//!   reproduce llama.cpp's tokens, not to be more accurate.
//! - [`Numerics::Fast`]: the fastest arithmetic that stays at least as
//!   faithful to [`Numerics::Exact`] as llama.cpp's: activations quantized
//!   to 8 bits per block (f32 scales) and dotted in integers against the
//!   weight's blocks, f32 accumulation, f32 attention. Its results do not
//!   depend on the thread count; they may differ between instruction sets
//!   only in the order of f32 sums.
//!
//! A backend is built for one mode; [`Numerics::default`] is
//! [`Numerics::Exact`] (the parity reference); commands that generate text
//! default to [`Numerics::Fast`].

use std::fmt;
use std::str::FromStr;

/// The arithmetic a backend's ops follow (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Numerics {
    /// Exact dequantization and f32 arithmetic.
    #[default]
    Exact,
    /// ggml's CPU arithmetic (llama.cpp's defaults).
    LlamaCpp,
    /// 8-bit activations and integer block dots (see the module docs).
    Fast,
}

impl Numerics {
    pub const ALL: [Numerics; 3] = [Numerics::Exact, Numerics::LlamaCpp, Numerics::Fast];

    /// The name used on command lines and in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::LlamaCpp => "llama-cpp",
            Numerics::Fast => "fast",
        }
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`Numerics::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown numerics {given:?} (expected \"exact\", \"llama-cpp\" or \"fast\")")]
pub struct UnknownNumerics {
    pub given: String,
}

impl FromStr for Numerics {
    type Err = UnknownNumerics;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Numerics::ALL
            .into_iter()
            .find(|n| n.name() == s)
            .ok_or_else(|| UnknownNumerics { given: s.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in Numerics::ALL {
            assert_eq!(n.name().parse::<Numerics>(), Ok(n));
        }
        assert_eq!(Numerics::default(), Numerics::Exact);
        assert!("llamacpp".parse::<Numerics>().is_err());
    }
}
