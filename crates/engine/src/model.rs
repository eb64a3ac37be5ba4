//! A model: its [`ArchSpec`], its weights on a backend, and the per-layer
//! rope tables. Loading checks everything the decoder will rely on, so a
//! session never meets a missing weight.

use crate::experts::{ExpertOptions, ExpertStore, Residency};
use crate::router::Router;
use crate::session::{Session, SessionOptions};
use crate::source::{ExpertBacking, InstallSource, WeightSource};
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
    /// Where the routed experts live.
    pub(crate) experts: ExpertStore,
}

impl<B: Backend> Model<B> {
    /// Loads an opened install (weights memory-mapped, not copied, on a host
    /// backend).
    pub fn load(install: &Install, backend: B) -> Result<Self, EngineError> {
        Self::open(install, backend, &ExpertOptions::mapped())
    }

    /// Loads an opened install with its routed experts held as `experts`
    /// decides (resident, mapped, or streamed by each session; see
    /// [`crate::experts`]); [`Model::expert_store`] tells the choice.
    pub fn open(
        install: &Install,
        backend: B,
        experts: &ExpertOptions,
    ) -> Result<Self, EngineError> {
        let store = ExpertStore::open(install, experts)?;
        let backing = match store.residency() {
            Residency::Resident => ExpertBacking::Read,
            Residency::Mapped => ExpertBacking::Mapped,
            Residency::Streamed => ExpertBacking::Absent,
        };
        let src = InstallSource::with_experts(install, backing)?;
        Self::build(install.manifest.arch.clone(), &src, backend, store)
    }

    /// Loads the weights `spec` needs from any source (routed experts
    /// included, held by the source).
    pub fn from_source(
        spec: ArchSpec,
        src: &dyn WeightSource,
        backend: B,
    ) -> Result<Self, EngineError> {
        let store = ExpertStore::held(&spec);
        Self::build(spec, src, backend, store)
    }

    fn build(
        spec: ArchSpec,
        src: &dyn WeightSource,
        backend: B,
        experts: ExpertStore,
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
        let streamed = experts.residency() == Residency::Streamed;
        let weights = Weights::load_with(&spec, src, &backend, !streamed)?;
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
            experts,
        })
    }

    /// Where the routed experts live, and why.
    pub fn expert_store(&self) -> &ExpertStore {
        &self.experts
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
