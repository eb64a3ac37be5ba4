//! Wall time of each phase of the forward pass, summed over a session's
//! calls: embedding, attention blocks, dense FFNs (dense layers and the
//! shared / parallel dense branches of MoE layers), routers (router matmul,
//! read-back and top-k), routed experts (fetching misses and computing) and
//! the head (final norm, output matrix, read-back of the logits), and
//! decode steps a device replays whole.
//!
//! Backends whose ops complete before they return (the CPU backend) give
//! each phase its true cost; an asynchronous backend would need to
//! synchronise at phase boundaries for these to mean the same. Timing reads
//! the monotonic clock once per phase boundary (tens of nanoseconds each)
//! and allocates nothing.

use std::fmt;
use std::time::{Duration, Instant};

/// The phases [`PhaseTimes`] separates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Embed,
    Attention,
    DenseFfn,
    Router,
    Experts,
    Head,
    /// A whole decode step recorded once and replayed by the device (see
    /// `Stream::replay_step`): its phases are not told apart.
    Step,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Embed,
        Phase::Attention,
        Phase::DenseFfn,
        Phase::Router,
        Phase::Experts,
        Phase::Head,
        Phase::Step,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Embed => "embed",
            Phase::Attention => "attention",
            Phase::DenseFfn => "dense FFN",
            Phase::Router => "router",
            Phase::Experts => "routed experts",
            Phase::Head => "head",
            Phase::Step => "replayed decode step",
        }
    }
}

/// Accumulated wall time per [`Phase`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseTimes {
    nanos: [u64; 7],
}

impl PhaseTimes {
    pub fn get(&self, phase: Phase) -> Duration {
        Duration::from_nanos(self.nanos[phase as usize])
    }

    /// Sum over every phase.
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.iter().sum())
    }

    /// Adds the time since `since` to `phase`; returns now, for the next
    /// phase to start from.
    pub(crate) fn lap(&mut self, phase: Phase, since: Instant) -> Instant {
        let now = Instant::now();
        self.nanos[phase as usize] += now.saturating_duration_since(since).as_nanos() as u64;
        now
    }

    /// Adds `d` to `phase` (a time measured elsewhere, or a test's).
    pub fn add(&mut self, phase: Phase, d: Duration) {
        self.nanos[phase as usize] += d.as_nanos() as u64;
    }

    pub fn reset(&mut self) {
        self.nanos = [0; 7];
    }
}

/// `attention 12.3 ms, dense FFN 4.5 ms, ...`: the phases that took any
/// time, in milliseconds.
impl fmt::Display for PhaseTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for p in Phase::ALL {
            let d = self.get(p);
            if d.is_zero() {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{} {:.2} ms", p.name(), d.as_secs_f64() * 1e3)?;
        }
        if first {
            f.write_str("nothing timed")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_accumulate_per_phase() {
        let mut t = PhaseTimes::default();
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let mid = t.lap(Phase::Attention, start);
        let end = t.lap(Phase::Head, mid);
        assert!(t.get(Phase::Attention) >= Duration::from_millis(2));
        assert_eq!(t.total(), end - start);
        assert_eq!(t.get(Phase::Router), Duration::ZERO);
        let s = t.to_string();
        assert!(s.starts_with("attention ") && s.contains(", head "), "{s}");
        assert!(!s.contains("router"), "{s}");
        t.reset();
        assert_eq!(t.to_string(), "nothing timed");
    }
}
