//! What a step's sampling needs beyond its [`SamplingRow`](super::SamplingRow)s
//! when it runs on the device: penalties and log probabilities, so that a
//! request asking for them does not send its step to the host path.
//!
//! Penalties need every token a request has seen, including the one the step in
//! flight is still sampling. So the device keeps them: each request with
//! penalties owns a *penalty slot*, a row of per-token counters (prompt tokens
//! marked once, output tokens counted by the device right after each step
//! samples them). The engine hands out the slots
//! ([`PenaltySlots`](super::penalty_slots::PenaltySlots)) and tells the runner,
//! per step, which slots to set up and which rows to penalise ([`StepExtras`]);
//! the runner's device does the rest.

use kernel_runtime::ops::PenaltyRow;

/// A penalty slot to set up before the step: cleared, then the prompt tokens
/// marked and the output tokens known so far counted.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotSetup {
    pub slot: u32,
    pub prompt: Vec<u32>,
    pub outputs: Vec<u32>,
}

/// The device-side sampling work of one step (empty for most steps).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepExtras {
    /// Slots first used by this step.
    pub setups: Vec<SlotSetup>,
    /// The sampling rows with penalties (`row` indexes the step's sampling rows).
    pub penalties: Vec<PenaltyRow>,
    /// `(sampling row, alternatives)` of the rows that report log probabilities.
    pub logprobs: Vec<(u32, usize)>,
}

impl StepExtras {
    pub fn is_empty(&self) -> bool {
        self.setups.is_empty() && self.penalties.is_empty() && self.logprobs.is_empty()
    }

    /// The penalty slot of each of `rows` sampling rows (-1: none): where the
    /// device counts each sampled token.
    pub fn row_slots(&self, rows: usize) -> Vec<i32> {
        let mut slots = vec![-1; rows];
        for p in &self.penalties {
            if let Some(s) = slots.get_mut(p.row as usize) {
                *s = p.slot as i32;
            }
        }
        slots
    }

    /// The most alternatives any row asks for.
    pub fn max_top_logprobs(&self) -> usize {
        self.logprobs.iter().map(|&(_, n)| n).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_slots_mark_the_penalised_rows() {
        let p = |row, slot| PenaltyRow { row, slot, repetition: 1.1, frequency: 0.0, presence: 0.0 };
        let extras = StepExtras { penalties: vec![p(2, 5), p(0, 1)], ..StepExtras::default() };
        assert_eq!(extras.row_slots(4), [1, -1, 5, -1]);
    }
}
