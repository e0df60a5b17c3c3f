//! The penalty slots of the requests that have penalties (see
//! [`extras`](super::extras)): which row of the device's penalty counters each
//! such request owns.

use std::collections::{BTreeSet, HashMap};

use crate::core::req::ReqId;

/// The penalty slots of the requests that have penalties: the lowest free slot
/// goes to a new request, and a finished request's slot is free again (the
/// device sets a slot up again before its next owner's first step, stream
/// ordered after every step of the previous owner).
#[derive(Debug, Default)]
pub struct PenaltySlots {
    owners: HashMap<ReqId, u32>,
    free: BTreeSet<u32>,
    next: u32,
}

impl PenaltySlots {
    /// The slot of `id`, and whether it was just given (and must be set up).
    pub fn slot(&mut self, id: ReqId) -> (u32, bool) {
        if let Some(&s) = self.owners.get(&id) {
            return (s, false);
        }
        let s = self.free.pop_first().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.owners.insert(id, s);
        (s, true)
    }

    /// Frees the slots of the requests `live` no longer holds.
    pub fn release_unless(&mut self, live: impl Fn(ReqId) -> bool) {
        if self.owners.is_empty() {
            return;
        }
        let free = &mut self.free;
        self.owners.retain(|&id, &mut s| {
            let keep = live(id);
            if !keep {
                free.insert(s);
            }
            keep
        });
    }

    /// Slots in use.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_once_their_request_is_gone() {
        let mut slots = PenaltySlots::default();
        let ids: Vec<ReqId> = (1..=3).map(ReqId::new).collect();
        assert_eq!(slots.slot(ids[0]), (0, true));
        assert_eq!(slots.slot(ids[1]), (1, true));
        assert_eq!(slots.slot(ids[0]), (0, false));
        assert_eq!(slots.slot(ids[2]), (2, true));
        slots.release_unless(|id| id == ids[2]);
        assert_eq!(slots.len(), 1);
        assert_eq!(slots.slot(ReqId::new(9)), (0, true));
        assert_eq!(slots.slot(ReqId::new(10)), (1, true));
        assert_eq!(slots.slot(ReqId::new(11)), (3, true));
    }
}
