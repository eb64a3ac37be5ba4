//! What a benchmark row says about the model, as llama-bench does: the
//! weights' bytes (`model_size`), their parameter count (`model_n_params`)
//! and a type line `family params format` (llama.cpp's `llama_model_desc`,
//! e.g. `llama 135M Q4_1`), where the format is the one holding the most
//! bytes.

use std::collections::BTreeMap;
use turbospark_core::QuantFormat;
use turbospark_format::install::Install;

/// Size and name of an install's weights.
#[derive(Debug, Clone)]
pub struct ModelDesc {
    /// The install directory's name.
    pub name: String,
    /// `family params format`, e.g. `llama 135M Q4_1`.
    pub kind: String,
    /// Bytes of every weight: resident tensors plus every expert's parts.
    pub bytes: u64,
    /// Elements of every weight.
    pub params: u64,
}

impl ModelDesc {
    pub fn of(install: &Install) -> ModelDesc {
        let m = &install.manifest;
        let mut by_format: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut add = |f: QuantFormat, bytes: u64| *by_format.entry(f.name()).or_default() += bytes;
        let (mut bytes, mut params) = (0u64, 0u64);
        for t in &install.index.tensors {
            add(t.dtype, t.length);
            bytes += t.length;
            params += t.shape.iter().product::<u64>();
        }
        for layer in &m.experts {
            let n = layer.num_experts as u64;
            for p in &layer.parts {
                add(p.dtype, p.length * n);
                bytes += p.length * n;
                params += p.shape.iter().product::<u64>() * n;
            }
        }
        let format = by_format
            .iter()
            .max_by_key(|(_, &b)| b)
            .map_or("-", |(f, _)| *f)
            .to_uppercase();
        let name = install.dir.file_name().map_or_else(
            || install.dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        ModelDesc {
            name,
            kind: format!(
                "{} {} {format}",
                turbospark_format::families::name(&m.arch.family),
                params_label(params)
            ),
            bytes,
            params,
        }
    }
}

/// `141K`, `135M`, `1.5B`: the parameter count as model names write it.
pub fn params_label(params: u64) -> String {
    let p = params as f64;
    if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.0}M", p / 1e6)
    } else {
        format!("{:.0}K", p / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(params_label(134_515_008), "135M");
        assert_eq!(params_label(20_914_757_184), "20.9B");
        assert_eq!(params_label(141_312), "141K");
    }
}
