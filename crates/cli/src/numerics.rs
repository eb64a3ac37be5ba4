//! `--numerics exact|llama-cpp|fast`: the arithmetic a command's backend is
//! built with, chosen once on the command line (see
//! `turbospark_backend::numerics` for what each mode computes). `logits`
//! defaults to `exact` (it is the parity tool); `run`, `chat` and `bench`
//! default to `fast`.

use turbospark_cpu::Numerics;

/// Help text shared by every `--numerics` option.
pub const HELP: &str = "Arithmetic: `exact` (dequantized weights, f32 on unrounded \
activations; matches HF transformers), `llama-cpp` (ggml's CPU arithmetic: 8-bit quantized \
activations, integer block dots, f16 KV cache and attention operands; reproduces llama.cpp's \
tokens) or `fast` (8-bit activations with f32 scales, integer block dots, f32 attention; the \
fastest, at least as faithful to exact as llama.cpp's; with `--backend cuda`: 8-bit activations \
for Q8_0, MXFP4, Q4_K, Q6_K and Q4_0/Q4_1/Q5_0/Q5_1 weights, the other formats' weights and \
activations rounded to bf16 on the tensor cores, an f16 KV cache)";

/// `--numerics` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NumericsArg {
    Exact,
    LlamaCpp,
    Fast,
}

impl From<NumericsArg> for Numerics {
    fn from(a: NumericsArg) -> Numerics {
        match a {
            NumericsArg::Exact => Numerics::Exact,
            NumericsArg::LlamaCpp => Numerics::LlamaCpp,
            NumericsArg::Fast => Numerics::Fast,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// The command-line names are the backend's own names.
    #[test]
    fn names_match_the_backend() {
        for a in NumericsArg::value_variants() {
            let name = a.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(Numerics::from(*a).name(), name);
        }
    }
}
