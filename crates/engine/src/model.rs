//! A model: its [`ArchSpec`], its weights on a backend, and the per-layer
//! rope tables. Loading checks everything the decoder will rely on, so a
//! session never meets a missing weight.

use crate::router::Router;
use crate::session::{Session, SessionOptions};
use crate::source::{InstallSource, WeightSource};
use crate::weights::Weights;
use crate::EngineError;
use turbospark_backend::{Backend, RopeTable};
use turbospark_core::arch::ArchSpec;
use turbospark_format::install::Install;

pub struct Model<B: Backend> {
    pub(crate) spec: ArchSpec,
    pub(crate) backend: B,
    pub(crate) weights: Weights<B>,
    /// Rope of each layer (`None` on NoPE layers).
    pub(crate) ropes: Vec<Option<RopeTable>>,
}

impl<B: Backend> Model<B> {
    /// Loads an opened install (weights memory-mapped, not copied, on a host
    /// backend).
    pub fn load(install: &Install, backend: B) -> Result<Self, EngineError> {
        let src = InstallSource::new(install)?;
        Self::from_source(install.manifest.arch.clone(), &src, backend)
    }

    /// Loads the weights `spec` needs from any source.
    pub fn from_source(
        spec: ArchSpec,
        src: &dyn WeightSource,
        backend: B,
    ) -> Result<Self, EngineError> {
        if let Some(norm) = spec.embedding.norm {
            if norm.has_weight() {
                return Err(EngineError::NotImplemented {
                    feature: "an embedding norm with a weight",
                });
            }
        }
        if let Some(m) = &spec.moe {
            // Fails now, not in the middle of a forward pass.
            Router::new(m)?;
        }
        let weights = Weights::load(&spec, src, &backend)?;
        let ropes = spec
            .layers
            .iter()
            .map(|l| l.rope.as_ref().map(RopeTable::new))
            .collect();
        Ok(Model {
            spec,
            backend,
            weights,
            ropes,
        })
    }

    pub fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn vocab_size(&self) -> usize {
        self.spec.vocab_size
    }

    /// A new session (KV cache and scratch) over this model.
    pub fn session(&self, options: SessionOptions) -> Result<Session<'_, B>, EngineError> {
        Session::new(self, options)
    }
}
