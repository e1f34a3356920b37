//! What a decode step with draft tokens yields (H5): how many of its drafts the simulated model accepts
//! (`EngineParams::draft_acceptance`), and how many tokens the step appends once the answer's cap or stop
//! cuts it.

use kv_pool::RequestId;

use super::Engine;
use crate::error::Result;
use crate::executor::Executor;

/// How many of the `depth` draft tokens proposed after position `context` (at positions `context + 1` to
/// `context + depth`) are accepted, each with probability `acceptance` given that the one before it was: the
/// leading run of drafts whose draw falls below `acceptance`. Each draw is a hash of `seed`, `request` and
/// the draft's position, so the count depends neither on the other requests of the step nor on when it runs.
pub(crate) fn accepted_drafts(
    seed: u64,
    request: RequestId,
    context: u32,
    depth: u32,
    acceptance: f64,
) -> u32 {
    (1..=depth)
        .take_while(|i| unit_draw(seed, request, context.saturating_add(*i)) < acceptance)
        .count() as u32
}

/// A draw in `[0, 1)` from `seed`, `request` and `position`: splitmix64's finalizer over their mix, its top
/// 53 bits as a fraction.
fn unit_draw(seed: u64, request: RequestId, position: u32) -> f64 {
    let mut x = seed
        ^ request.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ u64::from(position).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl<E: Executor> Engine<E> {
    /// Tokens `request`'s decode at position `context` yields: the token after the pending one, plus one for each
    /// accepted draft, cut where the answer reaches its cap or its stop, so it never overshoots either; at
    /// least one. An entry whose token the executor sampled (a model, which decides its own drafts) yields
    /// that one token.
    pub(crate) fn decode_yield(&self, request: RequestId, context: u32) -> Result<u32> {
        let req = self.table.get(request)?;
        let accepted = if self.scratch.model_tokens.contains_key(&request) {
            0
        } else {
            accepted_drafts(
                self.params.seed,
                request,
                context,
                self.params.draft_tokens,
                self.params.draft_acceptance,
            )
        };
        let to_cap = req.answer_cap.saturating_sub(req.answer_tokens);
        // The stop token comes where the answer reaches `stop_after` tokens (`sample`).
        let to_stop = req.spec.stop_after.map_or(u32::MAX, |stop_after| {
            stop_after.saturating_sub(req.answer_tokens)
        });
        Ok((1 + accepted).min(to_cap).min(to_stop).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_drafts_stay_within_zero_and_the_depth_and_follow_the_acceptance() {
        let (mut total, mut steps) = (0u64, 0u64);
        for request in 0..200 {
            for context in (0..400).step_by(7) {
                let n = accepted_drafts(9, RequestId(request), context, 3, 0.85);
                assert!(n <= 3);
                assert_eq!(accepted_drafts(9, RequestId(request), context, 3, 0.0), 0);
                assert_eq!(accepted_drafts(9, RequestId(request), context, 3, 1.0), 3);
                assert_eq!(accepted_drafts(9, RequestId(request), context, 0, 1.0), 0);
                total += u64::from(1 + n);
                steps += 1;
            }
        }
        // Expected tokens a step: (1 - 0.85^4) / (1 - 0.85) = 3.19.
        let mean = total as f64 / steps as f64;
        assert!((mean - 3.186).abs() < 0.05, "mean tokens a step {mean}");
    }

    #[test]
    fn a_draft_accepted_at_a_position_is_accepted_there_whatever_the_context_it_follows() {
        // The draft at position 12 is drawn once: following context 10 (second draft) or 11 (first draft).
        for request in 0..500 {
            let id = RequestId(request);
            let first_two = accepted_drafts(4, id, 10, 2, 0.5);
            let from_11 = accepted_drafts(4, id, 11, 1, 0.5);
            if first_two >= 1 {
                assert_eq!(first_two == 2, from_11 == 1, "{id}");
            }
        }
    }
}
