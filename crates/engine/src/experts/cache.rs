//! Which expert sits in which slot of one streamed layer, and which slot a
//! missing expert replaces.
//!
//! Work on a layer comes in groups (one decode token, or the tokens of a
//! prefill chunk whose experts fit the slots together). A group first pins
//! the slots of its experts that are already cached ([`SlotCache::pin`]),
//! then assigns each missing expert a slot ([`SlotCache::assign`]). Every
//! slot touched by the current group carries the group's tick, and a slot
//! with the current tick is never a victim, so no expert the group is about
//! to use is evicted by another of its misses. Starting the next group
//! ([`SlotCache::begin`]) releases all pins at once.
//!
//! Victims, among slots not pinned: an empty slot first (lowest index);
//! otherwise, under [`CachePolicy::Lfu`], the slot whose expert has been
//! requested the fewest times over the session, ties going to the least
//! recently used slot; under [`CachePolicy::Lru`], the least recently used
//! slot. Request counts are kept for every expert, cached or not, so an
//! expert that was popular before its eviction is preferred when it returns.
//!
//! The policy never changes what is computed, only what is read: slots are
//! addressed through the routes, and the decoder sums a token's experts in
//! router-rank order whichever slots they occupy.

use super::CachePolicy;

/// No expert / no slot.
pub(crate) const NONE: u32 = u32::MAX;

/// Slot bookkeeping of one layer; all tables are sized once.
pub(crate) struct SlotCache {
    policy: CachePolicy,
    /// Expert held by each slot, or [`NONE`]. `[slots]`
    expert: Vec<u32>,
    /// Tick of each slot's last use; the current tick pins. `[slots]`
    last_use: Vec<u64>,
    /// Slot holding each expert, or [`NONE`]. `[num_experts]`
    slot_of: Vec<u32>,
    /// Requests of each expert so far. `[num_experts]`
    requests: Vec<u64>,
    tick: u64,
}

impl SlotCache {
    pub(crate) fn new(policy: CachePolicy, slots: usize, num_experts: usize) -> SlotCache {
        SlotCache {
            policy,
            expert: vec![NONE; slots],
            last_use: vec![0; slots],
            slot_of: vec![NONE; num_experts],
            requests: vec![0; num_experts],
            tick: 0,
        }
    }

    pub(crate) fn slots(&self) -> usize {
        self.expert.len()
    }

    /// Starts a group: releases the previous group's pins.
    pub(crate) fn begin(&mut self) {
        self.tick += 1;
    }

    /// The slot holding `expert`, if any.
    pub(crate) fn slot_of(&self, expert: u32) -> Option<u32> {
        self.slot_of
            .get(expert as usize)
            .copied()
            .filter(|&s| s != NONE)
    }

    /// Counts a request for `expert` and, when it is cached, pins its slot
    /// for the current group and returns it.
    pub(crate) fn pin(&mut self, expert: u32) -> Option<u32> {
        if let Some(r) = self.requests.get_mut(expert as usize) {
            *r += 1;
        }
        let s = self.slot_of(expert)?;
        self.last_use[s as usize] = self.tick;
        Some(s)
    }

    /// Whether `expert` is cached in a slot pinned by the current group.
    pub(crate) fn pinned(&self, expert: u32) -> bool {
        self.slot_of(expert)
            .is_some_and(|s| self.last_use[s as usize] == self.tick)
    }

    /// Gives the uncached `expert` a slot, evicting the policy's victim, and
    /// pins it. The caller fills the slot before using it (or
    /// [`invalidate`](Self::invalidate)s it when the read fails). `None`
    /// when every slot is pinned.
    pub(crate) fn assign(&mut self, expert: u32) -> Option<u32> {
        if expert as usize >= self.slot_of.len() {
            return None;
        }
        let s = self.victim()?;
        let old = self.expert[s];
        if old != NONE {
            self.slot_of[old as usize] = NONE;
        }
        self.expert[s] = expert;
        self.slot_of[expert as usize] = s as u32;
        self.last_use[s] = self.tick;
        Some(s as u32)
    }

    /// Empties `slot` (its bytes could not be read).
    pub(crate) fn invalidate(&mut self, slot: u32) {
        let s = slot as usize;
        let old = self.expert[s];
        if old != NONE {
            self.slot_of[old as usize] = NONE;
        }
        self.expert[s] = NONE;
        self.last_use[s] = 0;
    }

    fn victim(&self) -> Option<usize> {
        let free = |s: &usize| self.last_use[*s] != self.tick;
        if let Some(s) = (0..self.slots())
            .filter(free)
            .find(|&s| self.expert[s] == NONE)
        {
            return Some(s);
        }
        let lfu = self.policy == CachePolicy::Lfu;
        (0..self.slots()).filter(free).min_by_key(|&s| {
            let uses = if lfu {
                self.requests[self.expert[s] as usize]
            } else {
                0
            };
            (uses, self.last_use[s])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs one group of experts through the cache; returns the misses.
    fn group(c: &mut SlotCache, experts: &[u32]) -> Vec<u32> {
        c.begin();
        for &e in experts {
            c.pin(e);
        }
        let mut misses = Vec::new();
        for &e in experts {
            if !c.pinned(e) {
                c.assign(e).expect("a free slot");
                misses.push(e);
            }
        }
        misses
    }

    #[test]
    fn lru_evicts_the_least_recent() {
        let mut c = SlotCache::new(CachePolicy::Lru, 2, 8);
        assert_eq!(group(&mut c, &[1, 2]), [1, 2]);
        assert_eq!(group(&mut c, &[1]), Vec::<u32>::new());
        assert_eq!(group(&mut c, &[3]), [3]); // evicts 2
        assert_eq!(c.slot_of(2), None);
        assert_eq!(group(&mut c, &[1]), Vec::<u32>::new());
    }

    #[test]
    fn lfu_keeps_the_popular_expert() {
        let mut c = SlotCache::new(CachePolicy::Lfu, 2, 8);
        for _ in 0..3 {
            group(&mut c, &[1]);
        }
        group(&mut c, &[2]);
        // 1 was used less recently than 2 but requested more often.
        assert_eq!(group(&mut c, &[3]), [3]);
        assert!(c.slot_of(1).is_some());
        assert_eq!(c.slot_of(2), None);
        // Equal counts: ties go to the least recently used slot.
        let mut t = SlotCache::new(CachePolicy::Lfu, 2, 8);
        group(&mut t, &[4]);
        group(&mut t, &[5]);
        assert_eq!(group(&mut t, &[6]), [6]);
        assert_eq!(t.slot_of(4), None);
        assert!(t.slot_of(5).is_some());
    }

    #[test]
    fn pinned_slots_are_never_victims() {
        let mut c = SlotCache::new(CachePolicy::Lfu, 2, 8);
        group(&mut c, &[0, 1]);
        // 0 is cached and pinned first; the miss 7 must take 1's slot.
        c.begin();
        assert!(c.pin(0).is_some());
        let s = c.assign(7).unwrap();
        assert_eq!(c.slot_of(7), Some(s));
        assert!(c.slot_of(0).is_some());
        // Both slots pinned now: no room for a third expert.
        assert_eq!(c.assign(6), None);
    }

    #[test]
    fn invalidated_slots_are_reused_first() {
        let mut c = SlotCache::new(CachePolicy::Lru, 3, 8);
        group(&mut c, &[1, 2, 3]);
        let s = c.slot_of(2).unwrap();
        c.invalidate(s);
        assert_eq!(c.slot_of(2), None);
        c.begin();
        assert_eq!(c.assign(5), Some(s));
    }
}
