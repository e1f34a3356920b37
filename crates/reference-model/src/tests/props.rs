//! Property test: any chunking of any prompt writes the bytes and logits of one chunk.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

use proptest::prelude::*;

use super::{Request, Storages, prefill_outcome, shapes, tokens};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        // PROPTEST_CASES overrides the count (e.g. 10x before a release).
        std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(16)
    ))]

    /// Prefilling a prompt of any length in chunks of any sizes leaves every page (full-attention and
    /// local, on every rank), the state pages and the last logits bit-identical to prefilling it in one
    /// chunk, for every shape.
    #[test]
    fn prop_any_chunking_writes_the_bits_of_one_chunk(
        seed in 0u64..1000,
        len in 1usize..160,
        chunks in proptest::collection::vec(1usize..40, 1..12),
    ) {
        let shapes = shapes();
        let (name, model) = &shapes[seed as usize % shapes.len()];
        let prompt = tokens(seed, len, model.config().vocab);
        let whole = prefill_outcome(model, &prompt, len);
        let storages = Storages::new(model);
        let mut request = Request::new(model, prompt.clone(), len as u32, 1, 1);
        let mut logits = None;
        let mut sizes = chunks.iter().cycle();
        while request.n_done < len {
            let n = sizes.next().copied().unwrap_or(1).min(len - request.n_done);
            let mut out = model.forward(storages.view(), &[request.entry(n)]).expect("forward");
            logits = out.pop().flatten();
            request.n_done += n;
        }
        prop_assert_eq!(request.used_bytes(model, &storages), whole.pages, "{}", name);
        prop_assert_eq!(storages.state_bytes(&request.state_pages), whole.state, "{}", name);
        prop_assert_eq!(logits, Some(whole.logits), "{}", name);
    }
}
