//! Per-request steering: the control vectors a request may name in its
//! `turbospark` extension object, and their resolution into a
//! [`Steering`] checked against the model.
//!
//! ```json
//! "turbospark": {
//!   "control_vectors": [{"name": "happy", "scale": 0.8}],
//!   "mode": "add",
//!   "layer_range": [10, 20]
//! }
//! ```
//!
//! For safety a request can only name vectors the operator made available
//! at startup: a name registered with `--request-control-vector NAME=FILE`,
//! or a file directly under the `--request-control-vector-dir` directory
//! (`NAME` or `NAME.gguf`; names are plain file names — letters, digits,
//! `_`, `-`, `.`, not starting with a dot — so no path leaves the
//! directory). The vectors, modes and layer numbering are those of
//! `--control-vector` ([`turbospark_engine::hooks`]); a request's steering
//! replaces the server's default (`--control-vector`) for that request, and
//! an empty list turns the default off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use turbospark_engine::{ControlVector, SteerMode, Steering};

use crate::error::{ApiError, Dialect};

/// Largest |scale| a request may give a vector.
pub const MAX_SCALE: f32 = 1000.0;

/// Most vectors one request may name.
pub const MAX_VECTORS: usize = 16;

/// What a request's `turbospark` object asks for, parsed but not resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct SteerRequest {
    /// `(name, scale)` of each vector, in order.
    pub vectors: Vec<(String, f32)>,
    pub mode: SteerMode,
    pub layer_range: Option<(usize, usize)>,
}

/// The vectors requests may use (see the module docs).
#[derive(Debug, Default)]
pub struct VectorLibrary {
    named: BTreeMap<String, ControlVector>,
    dir: Option<PathBuf>,
}

/// Why a vector could not be given to a request.
fn invalid(d: Dialect, msg: String) -> ApiError {
    ApiError::invalid(d, msg).with_param("turbospark.control_vectors")
}

impl VectorLibrary {
    /// Vectors registered by name, and a directory of vector files (if
    /// any), which must exist.
    pub fn new(
        named: BTreeMap<String, ControlVector>,
        dir: Option<PathBuf>,
    ) -> std::io::Result<Self> {
        let dir = dir.map(|d| d.canonicalize()).transpose()?;
        Ok(VectorLibrary { named, dir })
    }

    /// Whether requests may steer at all.
    pub fn is_empty(&self) -> bool {
        self.named.is_empty() && self.dir.is_none()
    }

    /// The vector `name`: a registered one, else a file under the directory.
    fn vector(&self, d: Dialect, name: &str) -> Result<ControlVector, ApiError> {
        if let Some(cv) = self.named.get(name) {
            return Ok(cv.clone());
        }
        let unknown = || {
            let names: Vec<&str> = self.named.keys().map(String::as_str).collect();
            invalid(
                d,
                format!(
                    "unknown control vector `{name}` (this server has {}{})",
                    if names.is_empty() {
                        "no named vectors".to_string()
                    } else {
                        names.join(", ")
                    },
                    if self.dir.is_some() {
                        " and the files of its vector directory"
                    } else {
                        ""
                    }
                ),
            )
        };
        let Some(dir) = &self.dir else {
            return Err(unknown());
        };
        if !plain_file_name(name) {
            return Err(invalid(
                d,
                format!(
                    "control vector name `{name}`: only letters, digits, `_`, `-` and `.` \
                     (not first) are allowed"
                ),
            ));
        }
        let path = [dir.join(name), dir.join(format!("{name}.gguf"))]
            .into_iter()
            .find(|p| p.is_file())
            .ok_or_else(unknown)?;
        // A link must not lead out of the directory.
        let inside = path.canonicalize().is_ok_and(|p| p.starts_with(dir));
        if !inside {
            return Err(unknown());
        }
        ControlVector::read_gguf(&path)
            .map_err(|e| invalid(d, format!("control vector `{name}`: {e}")))
    }

    /// Resolves `req` into a steering for a model of `n_layers` layers of
    /// `hidden`, checked as the engine checks it.
    pub fn resolve(
        &self,
        d: Dialect,
        req: &SteerRequest,
        n_layers: usize,
        hidden: usize,
    ) -> Result<Steering, ApiError> {
        if self.is_empty() && !req.vectors.is_empty() {
            return Err(invalid(
                d,
                "this server allows no per-request control vectors (start it with \
                 --request-control-vector NAME=FILE or --request-control-vector-dir DIR)"
                    .into(),
            ));
        }
        let vectors = req
            .vectors
            .iter()
            .map(|(name, scale)| Ok((self.vector(d, name)?, *scale)))
            .collect::<Result<Vec<_>, ApiError>>()?;
        let steering = Steering {
            mode: req.mode,
            vectors,
            layer_range: req.layer_range,
        };
        steering
            .check(n_layers, hidden)
            .map_err(|e| invalid(d, format!("control vectors: {e}")))?;
        Ok(steering)
    }
}

/// A name that is one file name in a directory: `[A-Za-z0-9_.-]+`, not
/// starting with a dot (so neither `..` nor hidden files).
fn plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && Path::new(name).components().count() == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(hidden: usize, layer: usize) -> ControlVector {
        let mut cv = ControlVector::new(hidden);
        cv.set(layer, vec![1.0; hidden]).unwrap();
        cv
    }

    fn req(names: &[&str]) -> SteerRequest {
        SteerRequest {
            vectors: names.iter().map(|n| (n.to_string(), 1.0)).collect(),
            mode: SteerMode::Add,
            layer_range: None,
        }
    }

    #[test]
    fn names_resolve_only_to_registered_vectors_and_plain_files() {
        let dir = std::env::temp_dir().join(format!("ts-steer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        vector(4, 1)
            .write_gguf(&dir.join("calm.gguf"), "m")
            .unwrap();
        vector(8, 1)
            .write_gguf(&dir.join("wide.gguf"), "m")
            .unwrap();
        let outside = dir.with_extension("outside.gguf");
        vector(4, 1).write_gguf(&outside, "m").unwrap();
        let named = BTreeMap::from([("happy".to_string(), vector(4, 2))]);
        let lib = VectorLibrary::new(named, Some(dir.clone())).unwrap();
        let d = Dialect::OpenAi;
        let s = lib.resolve(d, &req(&["happy", "calm"]), 3, 4).unwrap();
        assert_eq!(s.vectors.len(), 2);
        assert_eq!(s.vectors[0].0.get(2), Some(&[1.0; 4][..]));
        for bad in [
            "nope",
            "../outside",
            "..",
            ".hidden",
            "a/b",
            "/etc/passwd",
            "",
        ] {
            let e = lib.resolve(d, &req(&[bad]), 3, 4).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}");
        }
        // Another hidden size; a layer the model lacks.
        let e = lib.resolve(d, &req(&["wide"]), 3, 4).unwrap_err();
        assert!(e.body()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("control vectors"));
        assert!(lib.resolve(d, &req(&["happy"]), 2, 4).is_err());
        // No library: any vector is refused; none asked is fine.
        let none = VectorLibrary::default();
        assert_eq!(
            none.resolve(d, &req(&["happy"]), 3, 4)
                .unwrap_err()
                .status(),
            400
        );
        assert!(none.resolve(d, &req(&[]), 3, 4).unwrap().vectors.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&outside).unwrap();
    }
}
