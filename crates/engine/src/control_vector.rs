//! Control vectors in llama.cpp's GGUF format, and building them from
//! captured residuals.
//!
//! The file (written by llama.cpp's `llama-cvector-generator`
//! `export_gguf` and by repeng's `ControlVector.export_gguf`): metadata
//! `general.architecture = "controlvector"`, `controlvector.model_hint`
//! (the model's architecture) and `controlvector.layer_count`; one 1-D f32
//! tensor `direction.N` of the model's hidden size per steered layer,
//! `N ≥ 1`. llama.cpp's `common_control_vector_load_one` (common.cpp)
//! refuses `N = 0` and any tensor that is not 1-D f32 or whose width
//! differs from the others, sums tensors that name the same layer, and
//! `llama_adapter_cvec::apply_to` (llama-adapter.cpp) adds `direction.N`
//! to the output of decoder layer `N` counted from 0, which is HF's
//! `hidden_states[N + 1]`; layer 0 is never steered.
//!
//! Building (`llama-cvector-generator`, repeng `read_representations`):
//! for paired prompts `(p_i, n_i)` the residual after layer `N − 1`
//! (HF `hidden_states[N]`, llama.cpp `l_out-(N−1)`) is read at each prompt's
//! last token, `d_i = h(p_i) − h(n_i)`, and `direction.N` is
//!
//! - `mean-diff`: `mean_i d_i / |mean_i d_i|` (llama.cpp's `mean::run`
//!   normalises the mean the same way);
//! - `pca`: the first principal component of the centred `d_i` (repeng's
//!   `pca_diff`, sklearn `PCA(n_components=1)`), by power iteration on
//!   the `m × m` Gram matrix, its sign chosen so that the mean difference
//!   projects positively (repeng flips the sign by the same test on the
//!   projections of positive against negative states).
//!
//! Both are unit vectors; the scale given with `--control-vector FILE:SCALE`
//! is then in units of the residual stream.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use turbospark_core::QuantFormat;
use turbospark_format::gguf::{GgufFile, GgufValue};
use turbospark_format::gguf_writer::{GgufTensorDecl, GgufWriter};

/// What is wrong with a control vector file or a build.
#[derive(Debug, thiserror::Error)]
pub enum ControlVectorError {
    #[error(transparent)]
    Gguf(#[from] turbospark_format::gguf::GgufError),
    #[error(transparent)]
    Format(#[from] turbospark_format::FormatError),
    #[error(
        "{}: tensor '{name}' is not a control direction (expected 'direction.N' with N ≥ 1)",
        path.display()
    )]
    TensorName { path: PathBuf, name: String },
    #[error("{}: tensor '{name}' is {found}, expected a 1-D f32 vector", path.display())]
    TensorType {
        path: PathBuf,
        name: String,
        found: String,
    },
    #[error(
        "{}: tensor '{name}' has {found} elements, the earlier directions {expected}",
        path.display()
    )]
    Width {
        path: PathBuf,
        name: String,
        found: usize,
        expected: usize,
    },
    #[error("{}: no direction tensors", path.display())]
    Empty { path: PathBuf },
    #[error("direction of layer {layer} has {found} elements, the vector's width is {hidden}")]
    DirectionWidth {
        layer: usize,
        found: usize,
        hidden: usize,
    },
    #[error("layer 0 cannot be steered (llama.cpp never applies direction.0)")]
    LayerZero,
    #[error("building a control vector needs the same number (≥ 1) of positive and negative samples; got {positive} and {negative}")]
    Samples { positive: usize, negative: usize },
    #[error("the positive and negative residuals are identical at layer {layer}: no direction")]
    NoDirection { layer: usize },
}

/// One direction per steered layer, all of one width (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlVector {
    hidden: usize,
    directions: BTreeMap<usize, Vec<f32>>,
}

impl ControlVector {
    /// An empty vector of `hidden` elements per layer.
    pub fn new(hidden: usize) -> Self {
        ControlVector {
            hidden,
            directions: BTreeMap::new(),
        }
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Sets the direction added to the output of layer `layer` (≥ 1).
    pub fn set(&mut self, layer: usize, direction: Vec<f32>) -> Result<(), ControlVectorError> {
        if layer == 0 {
            return Err(ControlVectorError::LayerZero);
        }
        if direction.len() != self.hidden {
            return Err(ControlVectorError::DirectionWidth {
                layer,
                found: direction.len(),
                hidden: self.hidden,
            });
        }
        self.directions.insert(layer, direction);
        Ok(())
    }

    /// The direction of `layer`, if it has one.
    pub fn get(&self, layer: usize) -> Option<&[f32]> {
        self.directions.get(&layer).map(Vec::as_slice)
    }

    /// Steered layers, ascending.
    pub fn layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.directions.keys().copied()
    }

    /// `(layer, direction)`, ascending by layer.
    pub fn directions(&self) -> impl Iterator<Item = (usize, &[f32])> + '_ {
        self.directions.iter().map(|(&l, v)| (l, v.as_slice()))
    }

    /// Reads a llama.cpp control vector GGUF, with llama.cpp's checks.
    pub fn read_gguf(path: &Path) -> Result<Self, ControlVectorError> {
        let file = GgufFile::open(path)?;
        let mut hidden = None;
        let mut directions: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
        for t in file.tensors() {
            let layer = t
                .name
                .strip_prefix("direction.")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n >= 1)
                .ok_or_else(|| ControlVectorError::TensorName {
                    path: path.to_path_buf(),
                    name: t.name.clone(),
                })?;
            let shape = t.shape();
            if t.format() != Some(QuantFormat::F32) || shape.len() != 1 {
                return Err(ControlVectorError::TensorType {
                    path: path.to_path_buf(),
                    name: t.name.clone(),
                    found: format!("{} of shape {shape:?}", t.type_name()),
                });
            }
            let n = shape[0] as usize;
            let expected = *hidden.get_or_insert(n);
            if n != expected {
                return Err(ControlVectorError::Width {
                    path: path.to_path_buf(),
                    name: t.name.clone(),
                    found: n,
                    expected,
                });
            }
            let values = file
                .tensor_bytes(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            let dst = directions.entry(layer).or_insert_with(|| vec![0.0; n]);
            for (d, v) in dst.iter_mut().zip(values) {
                *d += v;
            }
        }
        let Some(hidden) = hidden else {
            return Err(ControlVectorError::Empty {
                path: path.to_path_buf(),
            });
        };
        Ok(ControlVector { hidden, directions })
    }

    /// Writes the vector as llama.cpp's `export_gguf` does; `model_hint`
    /// is the model's architecture (`llama`, ...).
    pub fn write_gguf(&self, path: &Path, model_hint: &str) -> Result<(), ControlVectorError> {
        let arch = "controlvector";
        let metadata = vec![
            (
                "general.architecture".to_string(),
                GgufValue::String(arch.into()),
            ),
            (
                format!("{arch}.model_hint"),
                GgufValue::String(model_hint.into()),
            ),
            (
                format!("{arch}.layer_count"),
                GgufValue::I32(self.directions.len() as i32),
            ),
        ];
        let decls = self
            .directions
            .keys()
            .map(|l| GgufTensorDecl {
                name: format!("direction.{l}"),
                shape: vec![self.hidden as u64],
                format: QuantFormat::F32,
            })
            .collect();
        let mut w = GgufWriter::create(path, &metadata, decls, true)?;
        for (l, v) in &self.directions {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            w.write_tensor(&format!("direction.{l}"), &bytes)?;
        }
        w.finish()?;
        Ok(())
    }
}

/// How [`build_direction`] reduces the paired differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildMethod {
    MeanDiff,
    Pca,
}

/// One layer's unit direction from paired residuals `positive[i]`,
/// `negative[i]` (module docs); `layer` names the layer in errors.
pub fn build_direction(
    method: BuildMethod,
    layer: usize,
    positive: &[&[f32]],
    negative: &[&[f32]],
) -> Result<Vec<f32>, ControlVectorError> {
    if positive.is_empty() || positive.len() != negative.len() {
        return Err(ControlVectorError::Samples {
            positive: positive.len(),
            negative: negative.len(),
        });
    }
    let d = positive[0].len();
    let diffs: Vec<Vec<f64>> = positive
        .iter()
        .zip(negative)
        .map(|(p, n)| {
            p.iter()
                .zip(n.iter())
                .map(|(&a, &b)| f64::from(a) - f64::from(b))
                .collect()
        })
        .collect();
    let m = diffs.len();
    let mut mean = vec![0f64; d];
    for r in &diffs {
        for (s, v) in mean.iter_mut().zip(r) {
            *s += v / m as f64;
        }
    }
    let dir = match method {
        BuildMethod::MeanDiff => mean.clone(),
        BuildMethod::Pca => {
            let centred: Vec<Vec<f64>> = diffs
                .iter()
                .map(|r| r.iter().zip(&mean).map(|(v, c)| v - c).collect())
                .collect();
            let pc = first_component(&centred, d);
            // Sign: the mean difference projects positively.
            let s: f64 = pc.iter().zip(&mean).map(|(a, b)| a * b).sum();
            if s < 0.0 {
                pc.iter().map(|v| -v).collect()
            } else {
                pc
            }
        }
    };
    let norm = dir.iter().map(|v| v * v).sum::<f64>().sqrt();
    if norm == 0.0 || !norm.is_finite() {
        return Err(ControlVectorError::NoDirection { layer });
    }
    Ok(dir.iter().map(|v| (v / norm) as f32).collect())
}

/// The leading right singular vector of the rows `x` (`[m, d]`), from the
/// leading eigenvector `a` of the Gram matrix `x xᵀ` (power iteration from
/// a fixed start): `xᵀ a`. Zero when `x` is zero.
fn first_component(x: &[Vec<f64>], d: usize) -> Vec<f64> {
    let m = x.len();
    let gram: Vec<Vec<f64>> = (0..m)
        .map(|i| {
            (0..m)
                .map(|j| x[i].iter().zip(&x[j]).map(|(a, b)| a * b).sum())
                .collect()
        })
        .collect();
    // A start that no eigenvector is orthogonal to in practice.
    let mut a: Vec<f64> = (0..m).map(|i| 1.0 + (i as f64) * 0.618_034).collect();
    for _ in 0..1000 {
        let next: Vec<f64> = gram
            .iter()
            .map(|row| row.iter().zip(&a).map(|(g, v)| g * v).sum())
            .collect();
        let norm = next.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm == 0.0 {
            return vec![0.0; d];
        }
        let next: Vec<f64> = next.iter().map(|v| v / norm).collect();
        let delta: f64 = next.iter().zip(&a).map(|(p, q)| (p - q).abs()).sum();
        a = next;
        if delta < 1e-13 {
            break;
        }
    }
    let mut v = vec![0f64; d];
    for (row, &w) in x.iter().zip(&a) {
        for (s, r) in v.iter_mut().zip(row) {
            *s += w * r;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: &[f64]) -> Vec<f64> {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn mean_diff_is_the_normalised_mean_difference() {
        let p = [vec![3.0f32, 1.0, 0.0], vec![1.0, 1.0, 2.0]];
        let n = [vec![1.0f32, 1.0, 0.0], vec![1.0, 0.0, 0.0]];
        let pr: Vec<&[f32]> = p.iter().map(|v| v.as_slice()).collect();
        let nr: Vec<&[f32]> = n.iter().map(|v| v.as_slice()).collect();
        let got = build_direction(BuildMethod::MeanDiff, 1, &pr, &nr).unwrap();
        // diffs (2,0,0) and (0,1,2): mean (1, 0.5, 1), norm 1.5
        let want = [1.0 / 1.5, 0.5 / 1.5, 1.0 / 1.5];
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?}");
        }
    }

    #[test]
    fn pca_finds_the_axis_of_largest_spread() {
        // Differences spread along (1, 2, 2)/3 around a mean of (0, 0, 1),
        // with a little spread along (2, -1, 0)/√5.
        let axis = unit(&[1.0, 2.0, 2.0]);
        let other = unit(&[2.0, -1.0, 0.0]);
        let coeffs = [(3.0, 0.1), (-2.0, -0.2), (1.0, 0.15), (-2.0, -0.05)];
        let mut p = Vec::new();
        let mut n = Vec::new();
        for (a, b) in coeffs {
            let diff: Vec<f64> = (0..3)
                .map(|i| a * axis[i] + b * other[i] + [0.0, 0.0, 1.0][i])
                .collect();
            p.push(diff.iter().map(|&v| (v + 5.0) as f32).collect::<Vec<_>>());
            n.push(vec![5.0f32; 3]);
        }
        let pr: Vec<&[f32]> = p.iter().map(|v| v.as_slice()).collect();
        let nr: Vec<&[f32]> = n.iter().map(|v| v.as_slice()).collect();
        let got = build_direction(BuildMethod::Pca, 3, &pr, &nr).unwrap();
        // Hand check: the centred differences are a·axis + b·other with
        // a ∈ {3.5, −1.5, 1.5, −1.5} (mean 0), b small; the leading
        // component is within a few degrees of the axis, signed so that
        // the mean (0, 0, 1) projects positively (axis_z = 2/3 > 0).
        let cos: f64 = got.iter().zip(&axis).map(|(&g, a)| f64::from(g) * a).sum();
        assert!(cos > 0.99, "{got:?} vs {axis:?}: cos {cos}");
        let len: f64 = got.iter().map(|&g| f64::from(g).powi(2)).sum();
        assert!((len - 1.0).abs() < 1e-6);
    }

    #[test]
    fn bad_samples_are_errors() {
        let a = [1.0f32, 2.0];
        assert!(matches!(
            build_direction(BuildMethod::MeanDiff, 1, &[&a], &[]),
            Err(ControlVectorError::Samples { .. })
        ));
        assert!(matches!(
            build_direction(BuildMethod::MeanDiff, 1, &[&a], &[&a]),
            Err(ControlVectorError::NoDirection { layer: 1 })
        ));
        let mut cv = ControlVector::new(2);
        assert!(matches!(
            cv.set(0, vec![1.0, 0.0]),
            Err(ControlVectorError::LayerZero)
        ));
        assert!(matches!(
            cv.set(1, vec![1.0]),
            Err(ControlVectorError::DirectionWidth { .. })
        ));
    }

    #[test]
    fn gguf_round_trip_and_llama_cpp_checks() {
        let dir = std::env::temp_dir().join(format!("turbospark-cv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.gguf");
        let mut cv = ControlVector::new(3);
        cv.set(1, vec![1.0, -2.0, 0.5]).unwrap();
        cv.set(4, vec![0.0, 3.0, 1.0]).unwrap();
        cv.write_gguf(&path, "llama").unwrap();
        let back = ControlVector::read_gguf(&path).unwrap();
        assert_eq!(back, cv);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(
            f.get("general.architecture").and_then(|v| v.as_str()),
            Some("controlvector")
        );
        assert_eq!(
            f.get("controlvector.layer_count").and_then(|v| v.as_i64()),
            Some(2)
        );

        // A file that is not a control vector: a tensor of another name.
        let bad = dir.join("bad.gguf");
        let decl = GgufTensorDecl {
            name: "blk.0.attn_q.weight".into(),
            shape: vec![3],
            format: QuantFormat::F32,
        };
        let mut w = GgufWriter::create(&bad, &[], vec![decl], true).unwrap();
        w.write_tensor("blk.0.attn_q.weight", &[0u8; 12]).unwrap();
        w.finish().unwrap();
        assert!(matches!(
            ControlVector::read_gguf(&bad),
            Err(ControlVectorError::TensorName { .. })
        ));
        // Not a GGUF at all.
        std::fs::write(&bad, b"not a gguf file").unwrap();
        assert!(matches!(
            ControlVector::read_gguf(&bad),
            Err(ControlVectorError::Gguf(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
