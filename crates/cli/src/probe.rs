//! The residual-stream options of `run`, `chat` and `logits`: capture to a
//! `.npy` file and steering with llama.cpp control vectors (the mechanism
//! is `turbospark_engine::hooks`).
//!
//! The capture file is NumPy float32 `[positions, layers, hidden]`, C
//! order, written as the tokens are computed: the header is written with
//! room to spare and rewritten with the final number of positions when the
//! capture ends, and the file appears under its name only then. A JSON
//! sidecar (`FILE` with the extension `.json`) names the model, the layers,
//! each row's position and token id, the numerics and the steering.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use turbospark_engine::{
    CapturedRows, ControlVector, Model, ResidualSink, Session, SteerMode, Steering,
};

use turbospark_backend::Device;

/// Which tokens' residuals a capture keeps.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapturePositions {
    /// The prompt's tokens (prefill).
    Prompt,
    /// The generated tokens fed back (decode).
    Generated,
    All,
}

impl CapturePositions {
    fn name(self) -> &'static str {
        match self {
            CapturePositions::Prompt => "prompt",
            CapturePositions::Generated => "generated",
            CapturePositions::All => "all",
        }
    }
    pub fn prompt(self) -> bool {
        self != CapturePositions::Generated
    }
    pub fn generated(self) -> bool {
        self != CapturePositions::Prompt
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    /// Add scale × direction (llama.cpp's behaviour).
    Add,
    /// Project the direction out (scale 1: entirely).
    Ablate,
    /// Set the component along the direction to the scale.
    Clamp,
}

/// Capture and steering options.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ProbeArgs {
    /// Write the residual stream after each chosen layer's output as a
    /// float32 NumPy array [positions, layers, hidden] (streamed to disk),
    /// with a JSON sidecar FILE.json (layers, positions, token ids).
    #[arg(long, value_name = "FILE")]
    pub capture_resid: Option<PathBuf>,
    /// Layers to capture, from 0: `A-B`, `L`, or a comma list of both
    /// (default: all). Layer L is HF's hidden_states[L+1].
    #[arg(long, value_name = "A-B", requires = "capture_resid")]
    pub capture_layers: Option<String>,
    /// Which positions to capture: prompt, generated or all (default).
    #[arg(long, value_enum, requires = "capture_resid")]
    pub capture_positions: Option<CapturePositions>,
    #[command(flatten)]
    pub steer: SteerArgs,
    /// Write an FFN census to FILE.json: per layer, the share of the FFN
    /// intermediate (dense and routed experts) with |a| below each
    /// threshold, and the neurons of highest mean |a|.
    #[arg(long, value_name = "FILE.json")]
    pub ffn_census: Option<PathBuf>,
    /// The census thresholds on |a|, a comma list.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.001,0.01,0.1",
        requires = "ffn_census"
    )]
    pub ffn_census_thresholds: Vec<f32>,
    /// Neurons listed per layer and site in the census.
    #[arg(long, default_value_t = 32, requires = "ffn_census")]
    pub ffn_census_top: usize,
}

/// Steering options (also `serve`'s).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SteerArgs {
    /// A llama.cpp control vector GGUF (direction.N added to layer N's
    /// output), optionally with a scale (default 1); repeatable: the
    /// vectors add up.
    #[arg(long = "control-vector", value_name = "FILE[:SCALE]")]
    pub control_vectors: Vec<String>,
    /// Steer only layers A..=B (llama.cpp's --control-vector-layer-range).
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub control_vector_layer_range: Option<Vec<usize>>,
    /// How the control vectors act: add (default), ablate or clamp.
    #[arg(long, value_enum, requires = "control_vectors")]
    pub control_vector_mode: Option<ModeArg>,
}

/// Splits `FILE[:SCALE]`; a suffix that is not a number is part of the path.
fn parse_vector_arg(s: &str) -> Result<(PathBuf, f32)> {
    if let Some((path, scale)) = s.rsplit_once(':') {
        if let Ok(v) = scale.parse::<f32>() {
            if !v.is_finite() {
                bail!("--control-vector {s}: the scale must be a finite number");
            }
            return Ok((PathBuf::from(path), v));
        }
    }
    Ok((PathBuf::from(s), 1.0))
}

/// Parses `A-B`, `L` and comma lists of both into layer indices, in order.
pub fn parse_layers(s: &str, n_layers: usize) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
            bail!("layers '{s}': '{part}' is not a layer or a range A-B");
        };
        if a > b || b >= n_layers {
            bail!(
                "layers '{s}': {a}-{b} is not within the model's layers 0-{}",
                n_layers.saturating_sub(1)
            );
        }
        for l in a..=b {
            if out.contains(&l) {
                bail!("layers '{s}': layer {l} is listed twice");
            }
            out.push(l);
        }
    }
    if out.is_empty() {
        bail!("layers '{s}': no layers");
    }
    Ok(out)
}

impl SteerArgs {
    /// The steering these options ask for, read from the files.
    pub fn steering(&self) -> Result<Option<Steering>> {
        if self.control_vectors.is_empty() {
            if self.control_vector_layer_range.is_some() {
                bail!("--control-vector-layer-range needs --control-vector");
            }
            return Ok(None);
        }
        let mut vectors = Vec::new();
        for arg in &self.control_vectors {
            let (path, scale) = parse_vector_arg(arg)?;
            let cv = ControlVector::read_gguf(&path)
                .with_context(|| format!("reading control vector {}", path.display()))?;
            vectors.push((cv, scale));
        }
        let layer_range = match self.control_vector_layer_range.as_deref() {
            None => None,
            Some([a, b]) => Some((*a, *b)),
            Some(_) => bail!("--control-vector-layer-range takes two layers, A and B"),
        };
        let mode = match self.control_vector_mode.unwrap_or(ModeArg::Add) {
            ModeArg::Add => SteerMode::Add,
            ModeArg::Ablate => SteerMode::Ablate,
            ModeArg::Clamp => SteerMode::Clamp,
        };
        Ok(Some(Steering {
            mode,
            vectors,
            layer_range,
        }))
    }
}

impl ProbeArgs {
    /// The steering these options ask for, read from the files.
    pub fn steering(&self) -> Result<Option<Steering>> {
        self.steer.steering()
    }

    pub fn positions(&self) -> Option<CapturePositions> {
        self.capture_resid
            .as_ref()
            .map(|_| self.capture_positions.unwrap_or(CapturePositions::All))
    }

    /// Sets steering and capture on `session`; returns which positions a
    /// capture keeps (none without a capture).
    /// Ends what [`ProbeArgs::apply`] started: finishes the capture and
    /// writes the FFN census.
    pub fn finish<D: Device>(
        &self,
        session: &mut Session<'_, D>,
        model_dir: &Path,
        numerics: &str,
    ) -> Result<()> {
        session.finish_capture()?;
        if let (Some(path), Some(census)) = (&self.ffn_census, session.ffn_census()) {
            let json = crate::census::census_json(census, self.ffn_census_top, model_dir, numerics);
            let text = serde_json::to_string_pretty(&json)?;
            std::fs::write(path, text + "\n")
                .with_context(|| format!("writing the FFN census {}", path.display()))?;
            eprintln!("FFN census written to {}", path.display());
        }
        Ok(())
    }

    pub fn apply<D: Device>(
        &self,
        session: &mut Session<'_, D>,
        model: &Model<D>,
        model_dir: &Path,
        numerics: &str,
    ) -> Result<Option<CapturePositions>> {
        let steering = self.steering()?;
        session
            .set_steering(steering.as_ref())
            .context("setting up the control vectors")?;
        if self.ffn_census.is_some() {
            session
                .set_ffn_census(Some(&self.ffn_census_thresholds))
                .context("--ffn-census")?;
        }
        let Some(path) = &self.capture_resid else {
            return Ok(None);
        };
        let spec = model.spec();
        let n_layers = spec.layers.len();
        let layers = match &self.capture_layers {
            Some(s) => parse_layers(s, n_layers)?,
            None => (0..n_layers).collect(),
        };
        let positions = self.positions().unwrap_or(CapturePositions::All);
        let meta = serde_json::json!({
            "model": model_dir.display().to_string(),
            "family": turbospark_format::families::name(&spec.family),
            "hidden": spec.hidden_size,
            "layers": layers,
            "layer_meaning": "output of decoder layer L (HF hidden_states[L+1]), after steering",
            "positions_kept": positions.name(),
            "numerics": numerics,
            "dtype": "float32",
            "steering": {
                "files": self.steer.control_vectors,
                "mode": format!("{:?}", self.steer.control_vector_mode.unwrap_or(ModeArg::Add)).to_lowercase(),
                "layer_range": self.steer.control_vector_layer_range,
            },
        });
        let sink = NpyStream::create(path, spec.hidden_size, layers.len(), meta)
            .with_context(|| format!("creating {}", path.display()))?;
        session.set_capture(&layers, Box::new(sink))?;
        Ok(Some(positions))
    }
}

/// Room for the `.npy` header: any shape of three dimensions fits.
const HEADER_BYTES: usize = 128;

/// The `.npy` header for `shape`, padded to [`HEADER_BYTES`] in all.
fn npy_header(shape: [usize; 3]) -> std::io::Result<Vec<u8>> {
    let dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        shape[0], shape[1], shape[2]
    );
    let body = HEADER_BYTES - 10;
    if dict.len() + 1 > body {
        return Err(std::io::Error::other("npy header too long"));
    }
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(body as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(HEADER_BYTES - 1, b' ');
    out.push(b'\n');
    Ok(out)
}

/// A capture written to `.npy` as it comes (module docs).
pub struct NpyStream {
    path: PathBuf,
    tmp: PathBuf,
    file: BufWriter<File>,
    hidden: usize,
    layers: usize,
    tokens: Vec<u32>,
    positions: Vec<usize>,
    meta: serde_json::Value,
    bytes: Vec<u8>,
}

impl NpyStream {
    pub fn create(
        path: &Path,
        hidden: usize,
        layers: usize,
        meta: serde_json::Value,
    ) -> std::io::Result<Self> {
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(".partial");
        let tmp = path.with_file_name(tmp_name);
        let mut file = BufWriter::new(File::create(&tmp)?);
        file.write_all(&npy_header([0, layers, hidden])?)?;
        Ok(NpyStream {
            path: path.to_path_buf(),
            tmp,
            file,
            hidden,
            layers,
            tokens: Vec::new(),
            positions: Vec::new(),
            meta,
            bytes: Vec::new(),
        })
    }

    /// The sidecar's path: the capture's with the extension `.json`.
    pub fn sidecar_path(path: &Path) -> PathBuf {
        path.with_extension("json")
    }
}

impl ResidualSink for NpyStream {
    fn write(&mut self, rows: &CapturedRows<'_>) -> std::io::Result<()> {
        if rows.hidden != self.hidden || rows.layers.len() != self.layers {
            return Err(std::io::Error::other("captured rows of another shape"));
        }
        self.bytes.clear();
        self.bytes
            .extend(rows.data.iter().flat_map(|v| v.to_le_bytes()));
        self.file.write_all(&self.bytes)?;
        self.tokens.extend_from_slice(rows.tokens);
        self.positions
            .extend((0..rows.tokens.len()).map(|i| rows.first_pos + i));
        Ok(())
    }

    fn finish(self: Box<Self>) -> std::io::Result<()> {
        let NpyStream {
            path,
            tmp,
            file,
            hidden,
            layers,
            tokens,
            positions,
            mut meta,
            ..
        } = *self;
        let result = (|| {
            let mut f = file.into_inner().map_err(|e| e.into_error())?;
            f.seek(SeekFrom::Start(0))?;
            f.write_all(&npy_header([tokens.len(), layers, hidden])?)?;
            f.sync_all()?;
            meta["shape"] = serde_json::json!([tokens.len(), layers, hidden]);
            meta["token_ids"] = serde_json::json!(tokens);
            meta["positions"] = serde_json::json!(positions);
            let side = NpyStream::sidecar_path(&path);
            crate::output::write_atomically(&side, |w| {
                serde_json::to_writer_pretty(&mut *w, &meta)?;
                w.write_all(b"\n")
            })?;
            std::fs::rename(&tmp, &path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_lists_and_vector_args() {
        assert_eq!(parse_layers("0-2,5", 6).unwrap(), vec![0, 1, 2, 5]);
        assert_eq!(parse_layers("3", 6).unwrap(), vec![3]);
        assert!(parse_layers("2-1", 6).is_err());
        assert!(parse_layers("0-6", 6).is_err());
        assert!(parse_layers("1,1", 6).is_err());
        assert!(parse_layers("x", 6).is_err());
        let (p, s) = parse_vector_arg("a/b.gguf:0.5").unwrap();
        assert_eq!((p.to_str().unwrap(), s), ("a/b.gguf", 0.5));
        let (p, s) = parse_vector_arg("c:/x.gguf").unwrap();
        assert_eq!((p.to_str().unwrap(), s), ("c:/x.gguf", 1.0));
        assert!(parse_vector_arg("v.gguf:inf").is_err());
    }

    #[test]
    fn streamed_npy_has_the_final_shape() {
        let dir = std::env::temp_dir().join(format!("ts-npystream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.npy");
        let mut s = Box::new(NpyStream::create(&path, 2, 1, serde_json::json!({})).unwrap());
        assert!(!path.exists());
        for (pos, v) in [(0usize, [1.0f32, 2.0]), (1, [3.0, 4.0])] {
            s.write(&CapturedRows {
                first_pos: pos,
                tokens: &[7],
                layers: &[0],
                hidden: 2,
                data: &v,
            })
            .unwrap();
        }
        s.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut want = Vec::new();
        crate::npy::write_f32(&mut want, &[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        // Same data after each header, and the header names the shape.
        assert_eq!(&bytes[HEADER_BYTES..], &want[want.len() - 16..]);
        let header = std::str::from_utf8(&bytes[10..HEADER_BYTES]).unwrap();
        assert!(header.contains("'shape': (2, 1, 2)"), "{header}");
        let side: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("r.json")).unwrap()).unwrap();
        assert_eq!(side["token_ids"], serde_json::json!([7, 7]));
        assert_eq!(side["positions"], serde_json::json!([0, 1]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
