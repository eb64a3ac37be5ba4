//! Hooks on the residual stream: capture (read it back after chosen
//! layers) and steering (change it with control vectors), one mechanism for
//! every family and every backend.
//!
//! Both act on `h`, the residual stream after decoder layer `L`'s output
//! (after the FFN's residual add and any `layer_output_scale`), which is HF
//! transformers' `hidden_states[L + 1]` of `output_hidden_states=True` and
//! the tensor llama.cpp names `l_out-L` (`llm_graph_context::build_cvec`
//! is applied to it in every `src/models/*.cpp`). Steering runs first, so a
//! capture sees what the next layer sees.
//!
//! Steering, per layer `L` in the range, with the control vectors' layer-`L`
//! directions `v_i` and scales `s_i` (llama.cpp's `direction.L`; see
//! [`crate::control_vector`]):
//!
//! ```text
//! add:    h += Σ_i s_i · v_i                       (llama.cpp llama_adapter_cvec::apply_to)
//! ablate: h -= s_i · (h · u_i) · u_i, u_i = v_i/|v_i|, each vector in turn
//! clamp:  h += (s_i − h · u_i) · u_i               (the component along u_i becomes s_i)
//! ```
//!
//! `add` is the backend's `add_bias` with the summed vector; `ablate` and
//! `clamp` are [`Stream::adjust_projection`]. The vectors are uploaded once
//! when steering is set.
//!
//! Capture copies `h` of each chosen layer into a device buffer
//! `[layers, n, hidden]` during the pass and reads it back once per forward
//! chunk, handing `[n, layers, hidden]` rows to a [`ResidualSink`] (the CLI
//! streams them to a `.npy` file). With neither hook set, the decoder pays
//! one branch per layer.

use crate::census::CensusState;
use crate::control_vector::ControlVector;
use crate::EngineError;
use turbospark_backend::{DType, Device, HostTensor, SharedBytes, Stream};
use turbospark_core::QuantFormat;

/// How control vectors change the residual stream (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SteerMode {
    /// Add `scale × direction` (llama.cpp's `--control-vector`).
    #[default]
    Add,
    /// Remove `scale ×` the component along the direction (1: all of it).
    Ablate,
    /// Set the component along the direction to `scale`.
    Clamp,
}

/// Control vectors to steer a session with.
#[derive(Debug, Clone, Default)]
pub struct Steering {
    pub mode: SteerMode,
    /// Each vector with its scale (llama.cpp's `FILE:SCALE`).
    pub vectors: Vec<(ControlVector, f32)>,
    /// Steered layers `start ..= end` (llama.cpp's
    /// `--control-vector-layer-range`); `None`: every layer a vector has.
    pub layer_range: Option<(usize, usize)>,
}

impl Steering {
    /// Checks the layer range and every vector's width and layers against
    /// a model of `n_layers` decoder layers of `hidden` (what
    /// [`crate::Session::set_steering`] and
    /// [`crate::Session::prepare_steering`] would refuse).
    pub fn check(&self, n_layers: usize, hidden: usize) -> Result<(), EngineError> {
        self.resolve(n_layers, hidden).map(|_| ())
    }

    /// The host-side change of each layer: for `add`, one summed vector;
    /// for `ablate`/`clamp`, the unit directions with their `(alpha, beta)`.
    /// Checks the layer range and every vector's width and layers.
    fn resolve(&self, n_layers: usize, hidden: usize) -> Result<Vec<LayerPlan>, EngineError> {
        let (start, end) = match self.layer_range {
            Some((a, b)) if a > b || b >= n_layers => {
                return Err(EngineError::SteeringLayerRange {
                    start: a,
                    end: b,
                    n_layers,
                })
            }
            Some(r) => r,
            None => (0, n_layers.saturating_sub(1)),
        };
        let mut plan: Vec<LayerPlan> = (0..n_layers).map(|_| LayerPlan::default()).collect();
        for (cv, scale) in &self.vectors {
            if cv.hidden() != hidden {
                return Err(EngineError::ControlVectorWidth {
                    found: cv.hidden(),
                    hidden,
                });
            }
            if let Some(layer) = cv.layers().find(|&l| l >= n_layers) {
                return Err(EngineError::ControlVectorLayer { layer, n_layers });
            }
            for (layer, dir) in cv.directions() {
                if layer < start || layer > end {
                    continue;
                }
                let p = &mut plan[layer];
                match self.mode {
                    SteerMode::Add => {
                        let sum = p.add.get_or_insert_with(|| vec![0.0; hidden]);
                        for (s, &d) in sum.iter_mut().zip(dir) {
                            *s += scale * d;
                        }
                    }
                    SteerMode::Ablate | SteerMode::Clamp => {
                        let norm = dir
                            .iter()
                            .map(|&v| f64::from(v) * f64::from(v))
                            .sum::<f64>()
                            .sqrt();
                        // A zero direction has no component to change.
                        if norm == 0.0 || !norm.is_finite() {
                            continue;
                        }
                        let unit = dir.iter().map(|&v| (f64::from(v) / norm) as f32).collect();
                        let (alpha, beta) = match self.mode {
                            SteerMode::Ablate => (-scale, 0.0),
                            _ => (-1.0, *scale),
                        };
                        p.adjust.push((unit, alpha, beta));
                    }
                }
            }
        }
        Ok(plan)
    }
}

#[derive(Default)]
struct LayerPlan {
    add: Option<Vec<f32>>,
    adjust: Vec<(Vec<f32>, f32, f32)>,
}

/// One layer's steering on the device.
struct LayerSteer<D: Device> {
    add: Option<D::Vector>,
    /// Unit direction, `alpha`, `beta` of [`Stream::adjust_projection`].
    adjust: Vec<(D::Vector, f32, f32)>,
}

/// A [`Steering`] uploaded to a model's device, ready to act on rows of the
/// residual stream: a session's own ([`crate::Session::set_steering`]) or
/// one sequence's in a batch of several ([`crate::BatchChunk::steering`],
/// made by [`crate::Session::prepare_steering`]).
pub struct PreparedSteering<D: Device> {
    /// Per layer; empty when nothing is steered.
    layers: Vec<LayerSteer<D>>,
}

impl<D: Device> PreparedSteering<D> {
    /// Checks `steering` against a model of `n_layers` layers of `hidden`
    /// and uploads its vectors.
    pub(crate) fn new(
        device: &D,
        n_layers: usize,
        hidden: usize,
        steering: &Steering,
    ) -> Result<Self, EngineError> {
        let plan = steering.resolve(n_layers, hidden)?;
        let vector = |name: String, v: &[f32]| -> Result<D::Vector, EngineError> {
            let t = HostTensor {
                name,
                format: QuantFormat::F32,
                shape: vec![v.len()],
                bytes: SharedBytes::from_f32(v),
            };
            Ok(device.upload_vector(&t)?)
        };
        let mut layers = Vec::with_capacity(n_layers);
        let mut any = false;
        for (l, p) in plan.into_iter().enumerate() {
            let add = p
                .add
                .map(|v| vector(format!("control vector, layer {l}"), &v))
                .transpose()?;
            let adjust = p
                .adjust
                .into_iter()
                .map(|(u, a, b)| Ok((vector(format!("control direction, layer {l}"), &u)?, a, b)))
                .collect::<Result<Vec<_>, EngineError>>()?;
            any |= add.is_some() || !adjust.is_empty();
            layers.push(LayerSteer { add, adjust });
        }
        if !any {
            layers.clear();
        }
        Ok(PreparedSteering { layers })
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Whether it changes the output of layer `l`.
    pub(crate) fn steers_layer(&self, l: usize) -> bool {
        self.layers
            .get(l)
            .is_some_and(|s| s.add.is_some() || !s.adjust.is_empty())
    }

    /// Steers the first `n` rows of `h` after layer `l`.
    pub(crate) fn apply(
        &self,
        st: &mut D::Stream,
        l: usize,
        h: &mut D::Buf,
        n: usize,
    ) -> Result<(), EngineError> {
        if let Some(s) = self.layers.get(l) {
            if let Some(v) = &s.add {
                st.add_bias(h, v, n)?;
            }
            for (u, alpha, beta) in &s.adjust {
                st.adjust_projection(h, n, u, *alpha, *beta)?;
            }
        }
        Ok(())
    }
}

/// Rows of the residual stream read back after one forward chunk.
#[derive(Debug, Clone, Copy)]
pub struct CapturedRows<'a> {
    /// Position of the first row.
    pub first_pos: usize,
    /// The chunk's token ids, one per row.
    pub tokens: &'a [u32],
    /// The captured layers, in the order of `data`'s middle axis.
    pub layers: &'a [usize],
    pub hidden: usize,
    /// `[tokens.len(), layers.len(), hidden]`, row-major.
    pub data: &'a [f32],
}

/// Where captured residuals go (a file, memory).
pub trait ResidualSink: Send {
    /// Takes the rows of one forward chunk.
    fn write(&mut self, rows: &CapturedRows<'_>) -> std::io::Result<()>;
    /// Called once when the capture ends ([`crate::Session::finish_capture`]).
    fn finish(self: Box<Self>) -> std::io::Result<()>;
}

struct Capture<D: Device> {
    layers: Vec<usize>,
    /// Index into `layers` of each model layer that is captured.
    slot_of: Vec<Option<usize>>,
    /// `[layers, n, hidden]` of the current chunk (`n ≤ max_batch`).
    buf: D::Buf,
    /// The same, read back.
    host: Vec<f32>,
    /// Transposed to `[n, layers, hidden]`.
    rows: Vec<f32>,
    sink: Box<dyn ResidualSink>,
    enabled: bool,
}

/// A session's hooks (see the module docs); none by default.
pub(crate) struct Hooks<D: Device> {
    /// The session's steering; empty when not steering.
    steer: PreparedSteering<D>,
    capture: Option<Capture<D>>,
    /// The FFN census ([`crate::census`]), read by the decoder's FFNs.
    pub(crate) census: Option<CensusState<D>>,
    /// Whether [`Hooks::after_layer`] has anything to do, or a census runs.
    active: bool,
}

impl<D: Device> Default for Hooks<D> {
    fn default() -> Self {
        Hooks {
            steer: PreparedSteering { layers: Vec::new() },
            capture: None,
            census: None,
            active: false,
        }
    }
}

impl<D: Device> Hooks<D> {
    fn refresh(&mut self) {
        self.active = !self.steer.is_empty()
            || self.capture.as_ref().is_some_and(|c| c.enabled)
            || self.census.is_some();
    }

    /// Starts (`Some`) or stops an FFN census.
    pub(crate) fn set_census(&mut self, census: Option<CensusState<D>>) {
        self.census = census;
        self.refresh();
    }

    /// Replaces the steering (`None`: none). Nothing changes on error.
    pub(crate) fn set_steering(
        &mut self,
        device: &D,
        n_layers: usize,
        hidden: usize,
        steering: Option<&Steering>,
    ) -> Result<(), EngineError> {
        self.steer = match steering {
            Some(steering) => PreparedSteering::new(device, n_layers, hidden, steering)?,
            None => PreparedSteering { layers: Vec::new() },
        };
        self.refresh();
        Ok(())
    }

    /// Starts capturing `layers` (each `< n_layers`, no repeats) into
    /// `sink`, replacing any capture (which is finished first).
    pub(crate) fn set_capture(
        &mut self,
        device: &D,
        n_layers: usize,
        hidden: usize,
        max_batch: usize,
        layers: &[usize],
        sink: Box<dyn ResidualSink>,
    ) -> Result<(), EngineError> {
        let mut slot_of = vec![None; n_layers];
        for (i, &l) in layers.iter().enumerate() {
            match slot_of.get_mut(l) {
                None => return Err(EngineError::CaptureLayer { layer: l, n_layers }),
                Some(Some(_)) => return Err(EngineError::CaptureRepeat { layer: l }),
                Some(s) => *s = Some(i),
            }
        }
        if layers.is_empty() {
            return Err(EngineError::BadOptions {
                detail: "a capture needs at least one layer".into(),
            });
        }
        let len = layers.len() * max_batch * hidden;
        let buf = device.alloc(DType::F32, len)?;
        self.finish_capture()?;
        self.capture = Some(Capture {
            layers: layers.to_vec(),
            slot_of,
            buf,
            host: vec![0.0; len],
            rows: vec![0.0; len],
            sink,
            enabled: true,
        });
        self.refresh();
        Ok(())
    }

    /// Pauses (`false`) or resumes the capture, if any.
    pub(crate) fn set_capture_enabled(&mut self, on: bool) {
        if let Some(c) = &mut self.capture {
            c.enabled = on;
        }
        self.refresh();
    }

    /// Ends the capture, if any, and finishes its sink.
    pub(crate) fn finish_capture(&mut self) -> Result<(), EngineError> {
        let capture = self.capture.take();
        self.refresh();
        if let Some(c) = capture {
            c.sink
                .finish()
                .map_err(|source| EngineError::CaptureSink { source })?;
        }
        Ok(())
    }

    /// Whether [`Hooks::after_layer`] or [`Hooks::end_chunk`] do anything.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// Whether a capture or a census watches the forward passes (they
    /// follow one sequence; steering acts on every row alike).
    pub(crate) fn observes(&self) -> bool {
        self.capture.as_ref().is_some_and(|c| c.enabled) || self.census.is_some()
    }

    /// Whether control vectors steer layer outputs.
    pub(crate) fn steers(&self) -> bool {
        !self.steer.is_empty()
    }

    /// Steers the `n` rows of `h` after layer `l`.
    pub(crate) fn steer(
        &self,
        st: &mut D::Stream,
        l: usize,
        h: &mut D::Buf,
        n: usize,
    ) -> Result<(), EngineError> {
        self.steer.apply(st, l, h, n)
    }

    /// Steers, then captures, `h` (`[n, hidden]`) after layer `l`.
    pub(crate) fn after_layer(
        &mut self,
        st: &mut D::Stream,
        l: usize,
        h: &mut D::Buf,
        n: usize,
        hidden: usize,
    ) -> Result<(), EngineError> {
        self.steer(st, l, h, n)?;
        if let Some(c) = self.capture.as_mut().filter(|c| c.enabled) {
            if let Some(slot) = c.slot_of[l] {
                st.copy(h, 0, &mut c.buf, slot * n * hidden, n * hidden)?;
            }
        }
        Ok(())
    }

    /// Reads the chunk's captured rows back and hands them to the sink.
    pub(crate) fn end_chunk(
        &mut self,
        st: &mut D::Stream,
        first_pos: usize,
        tokens: &[u32],
        hidden: usize,
    ) -> Result<(), EngineError> {
        let Some(c) = self.capture.as_mut().filter(|c| c.enabled) else {
            return Ok(());
        };
        let (n, k) = (tokens.len(), c.layers.len());
        let len = k * n * hidden;
        st.read(&c.buf, &mut c.host[..len])?;
        // [layers, n, hidden] -> [n, layers, hidden]
        for slot in 0..k {
            for t in 0..n {
                let src = (slot * n + t) * hidden;
                let dst = (t * k + slot) * hidden;
                c.rows[dst..dst + hidden].copy_from_slice(&c.host[src..src + hidden]);
            }
        }
        let rows = CapturedRows {
            first_pos,
            tokens,
            layers: &c.layers,
            hidden,
            data: &c.rows[..len],
        };
        c.sink
            .write(&rows)
            .map_err(|source| EngineError::CaptureSink { source })
    }
}
