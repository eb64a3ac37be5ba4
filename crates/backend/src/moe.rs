//! Parameter types of the routed-expert ops.

use crate::Device;
use turbospark_core::arch::Activation;

/// `(expert slot, weight)` for one token and one router rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[repr(C)]
pub struct Route {
    /// Index into the [`ExpertBank`](crate::ExpertBank) the routes are
    /// applied to (the expert id for a resident bank).
    pub slot: u32,
    pub weight: f32,
}

/// The weights of one routed expert: `down(act(gate·x + bg) ⊙ (up·x + bu)) + bd`.
#[derive(Debug, Clone)]
pub struct ExpertWeights<M, V> {
    /// `[intermediate, hidden]`
    pub gate: M,
    /// `[intermediate, hidden]`
    pub up: M,
    /// `[hidden, intermediate]`
    pub down: M,
    pub gate_bias: Option<V>,
    pub up_bias: Option<V>,
    pub down_bias: Option<V>,
}

/// One of an expert's three projections: what a partial slot fill
/// ([`Stream::fill_slot_rows`](crate::Stream::fill_slot_rows)) copies rows of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    Gate,
    Up,
    Down,
}

impl Projection {
    /// Every projection (gate, up, down: the order of `ExpertWeights`'
    /// fields and of an install's expert records).
    pub const ALL: [Projection; 3] = [Projection::Gate, Projection::Up, Projection::Down];
}

impl<M, V> ExpertWeights<M, V> {
    /// The weights of projection `p`.
    pub fn projection(&self, p: Projection) -> &M {
        match p {
            Projection::Gate => &self.gate,
            Projection::Up => &self.up,
            Projection::Down => &self.down,
        }
    }
}

/// What the MoE ops compute on.
pub struct MoeInput<'a, D: Device> {
    /// `[n_tokens, hidden]`
    pub x: &'a D::Buf,
    pub n_tokens: usize,
    /// `[n_tokens, top_k]` into `bank`, best rank first.
    pub routes: &'a D::Routes,
    pub bank: &'a D::Bank,
    pub activation: Activation,
}

impl<D: Device> Clone for MoeInput<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for MoeInput<'_, D> {}

/// Buffers the MoE ops work in, allocated once per session.
pub struct MoeScratch<B> {
    /// Rows routed to one expert, gathered, then that expert's outputs:
    /// `[max_tokens, hidden]`.
    pub x: B,
    /// `[max_tokens, expert_intermediate]`
    pub gate: B,
    /// `[max_tokens, expert_intermediate]`
    pub up: B,
    /// Unweighted expert outputs per (token, rank): `[max_tokens · top_k, hidden]`.
    pub y: B,
}
