//! A model: its [`ArchSpec`], its weights uploaded once to a [`Device`]
//! and shared by every session, and the per-layer rope tables. Loading
//! checks everything the decoder will rely on, so a session never meets a
//! missing weight.

use crate::experts::{ExpertOptions, ExpertStore, Residency};
use crate::source::{ExpertBacking, InstallSource, WeightSource};
use crate::weights::Weights;
use crate::EngineError;
use turbospark_backend::{Device, Numerics, RopeTable, RouterSpec};
use turbospark_core::arch::{ArchSpec, RopeScaling, RopeSpec};
use turbospark_format::install::Install;

pub struct Model<D: Device> {
    pub(crate) spec: ArchSpec,
    pub(crate) device: D,
    pub(crate) weights: Weights<D>,
    /// The router of every MoE layer, checked at load.
    pub(crate) router: Option<RouterSpec>,
    /// Rope of each layer (`None` on NoPE layers).
    pub(crate) ropes: Vec<Option<RopeTable>>,
    /// Where the routed experts live.
    pub(crate) experts: ExpertStore,
}

impl<D: Device> Model<D> {
    /// Loads an opened install (weights memory-mapped, not copied, on a host
    /// backend).
    pub fn load(install: &Install, device: D) -> Result<Self, EngineError> {
        Self::open(install, device, &ExpertOptions::mapped())
    }

    /// Loads an opened install with its routed experts held as `experts`
    /// decides (resident, mapped, or streamed by each session; see
    /// [`crate::experts`]); [`Model::expert_store`] tells the choice.
    pub fn open(
        install: &Install,
        device: D,
        experts: &ExpertOptions,
    ) -> Result<Self, EngineError> {
        // The weights live in the device's memory (host memory on the CPU).
        let available = device
            .memory()
            .free
            .or_else(crate::experts::available_memory);
        let store = ExpertStore::open(install, experts, available)?;
        let backing = match store.residency() {
            Residency::Resident => ExpertBacking::Read,
            Residency::Mapped => ExpertBacking::Mapped,
            Residency::Streamed => ExpertBacking::Absent,
        };
        let src = InstallSource::with_experts(install, backing)?;
        let copies = device.copies_weights();
        let model = Self::build(install.manifest.arch.clone(), &src, device, store)?;
        if copies {
            // The device holds its own copy; the mapping's pages would
            // otherwise count twice against the memory bound. Advice only:
            // failing to give it costs memory, not correctness.
            let _ = install.release_resident_pages();
        }
        Ok(model)
    }

    /// Loads the weights `spec` needs from any source (routed experts
    /// included, held by the source).
    pub fn from_source(
        spec: ArchSpec,
        src: &dyn WeightSource,
        device: D,
    ) -> Result<Self, EngineError> {
        let store = ExpertStore::held(&spec);
        Self::build(spec, src, device, store)
    }

    fn build(
        spec: ArchSpec,
        src: &dyn WeightSource,
        device: D,
        experts: ExpertStore,
    ) -> Result<Self, EngineError> {
        if let Some(norm) = spec.embedding.norm {
            if norm.has_weight() {
                return Err(EngineError::NotImplemented {
                    feature: "an embedding norm with a weight",
                });
            }
        }
        // Fails now, not in the middle of a forward pass.
        let router = spec.moe.as_ref().map(RouterSpec::of).transpose()?;
        let streamed = experts.residency() == Residency::Streamed;
        let weights = Weights::load_with(&spec, src, &device, !streamed)?;
        let numerics = device.numerics();
        let ropes = spec
            .layers
            .iter()
            .map(|l| l.rope.map(|r| RopeTable::new(&rope_in(r, numerics))))
            .collect();
        Ok(Model {
            spec,
            device,
            weights,
            router,
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

    /// The device holding the weights.
    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn vocab_size(&self) -> usize {
        self.spec.vocab_size
    }
}

/// The rope a numerics mode computes: ggml rounds YaRN's correction range
/// to whole dimensions whatever the model says (`ggml_rope_yarn_corr_dims`),
/// so llama.cpp's arithmetic truncates it even for gpt-oss, whose HF config
/// does not.
fn rope_in(mut rope: RopeSpec, numerics: Numerics) -> RopeSpec {
    if let (Numerics::LlamaCpp, RopeScaling::Yarn { truncate, .. }) = (numerics, &mut rope.scaling)
    {
        *truncate = true;
    }
    rope
}
