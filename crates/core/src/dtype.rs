//! Element formats a tensor can be stored in.
//!
//! Block formats follow the ggml definitions (llama.cpp `ggml-common.h`):
//! a row of `n` elements is `n / block_elems` blocks of `block_bytes` each,
//! so a row's byte length is exact and a row never shares a block with the
//! next one.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The storage format of a tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantFormat {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    #[serde(rename = "q4_k")]
    Q4K,
    #[serde(rename = "q5_k")]
    Q5K,
    #[serde(rename = "q6_k")]
    Q6K,
    /// OCP microscaling FP4: 32 e2m1 values sharing one E8M0 scale, stored in
    /// the ggml block layout (scale byte, then 16 bytes: element `j` in the
    /// low nibble of byte `j`, element `j + 16` in the high nibble).
    Mxfp4,
}

impl QuantFormat {
    pub const ALL: [QuantFormat; 12] = [
        QuantFormat::F32,
        QuantFormat::F16,
        QuantFormat::Bf16,
        QuantFormat::Q8_0,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
        QuantFormat::Mxfp4,
    ];

    /// Elements per block (1 for the plain float formats).
    pub const fn block_elems(self) -> usize {
        match self {
            QuantFormat::F32 | QuantFormat::F16 | QuantFormat::Bf16 => 1,
            QuantFormat::Q8_0
            | QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Mxfp4 => 32,
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantFormat::F32 => 4,
            QuantFormat::F16 | QuantFormat::Bf16 => 2,
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q4K => 144,
            QuantFormat::Q5K => 176,
            QuantFormat::Q6K => 210,
            QuantFormat::Mxfp4 => 17,
        }
    }

    /// Byte length of `n` elements, or `None` when `n` is not a whole number
    /// of blocks (or the length overflows).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if n % be != 0 {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }

    /// The ggml type id used in GGUF files.
    pub const fn ggml_type(self) -> u32 {
        match self {
            QuantFormat::F32 => 0,
            QuantFormat::F16 => 1,
            QuantFormat::Q4_0 => 2,
            QuantFormat::Q4_1 => 3,
            QuantFormat::Q5_0 => 6,
            QuantFormat::Q5_1 => 7,
            QuantFormat::Q8_0 => 8,
            QuantFormat::Q4K => 12,
            QuantFormat::Q5K => 13,
            QuantFormat::Q6K => 14,
            QuantFormat::Bf16 => 30,
            QuantFormat::Mxfp4 => 39,
        }
    }

    /// The format for a ggml type id, if turbospark supports it.
    pub fn from_ggml_type(id: u32) -> Option<Self> {
        QuantFormat::ALL.into_iter().find(|f| f.ggml_type() == id)
    }

    /// Lower-case name, as written in manifests and by `inspect`.
    pub const fn name(self) -> &'static str {
        match self {
            QuantFormat::F32 => "f32",
            QuantFormat::F16 => "f16",
            QuantFormat::Bf16 => "bf16",
            QuantFormat::Q8_0 => "q8_0",
            QuantFormat::Q4_0 => "q4_0",
            QuantFormat::Q4_1 => "q4_1",
            QuantFormat::Q5_0 => "q5_0",
            QuantFormat::Q5_1 => "q5_1",
            QuantFormat::Q4K => "q4_k",
            QuantFormat::Q5K => "q5_k",
            QuantFormat::Q6K => "q6_k",
            QuantFormat::Mxfp4 => "mxfp4",
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Name of a ggml type id for error messages, including types turbospark does
/// not support (so the message can say what was found).
pub fn ggml_type_name(id: u32) -> String {
    const NAMES: [&str; 40] = [
        "f32",
        "f16",
        "q4_0",
        "q4_1",
        "q4_2",
        "q4_3",
        "q5_0",
        "q5_1",
        "q8_0",
        "q8_1",
        "q2_k",
        "q3_k",
        "q4_k",
        "q5_k",
        "q6_k",
        "q8_k",
        "iq2_xxs",
        "iq2_xs",
        "iq3_xxs",
        "iq1_s",
        "iq4_nl",
        "iq3_s",
        "iq2_s",
        "iq4_xs",
        "i8",
        "i16",
        "i32",
        "i64",
        "f64",
        "iq1_m",
        "bf16",
        "q4_0_4_4",
        "q4_0_4_8",
        "q4_0_8_8",
        "tq1_0",
        "tq2_0",
        "iq4_nl_4_4",
        "iq4_nl_4_8",
        "iq4_nl_8_8",
        "mxfp4",
    ];
    NAMES
        .get(id as usize)
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("ggml type {id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip_and_names_agree() {
        for f in QuantFormat::ALL {
            assert_eq!(QuantFormat::from_ggml_type(f.ggml_type()), Some(f));
            assert_eq!(ggml_type_name(f.ggml_type()), f.name());
        }
        assert_eq!(QuantFormat::from_ggml_type(10), None, "q2_k is unsupported");
    }

    #[test]
    fn bytes_for_rejects_partial_blocks() {
        assert_eq!(QuantFormat::Q4K.bytes_for(512), Some(288));
        assert_eq!(QuantFormat::Q4K.bytes_for(100), None);
        assert_eq!(QuantFormat::Mxfp4.bytes_for(64), Some(34));
    }
}
