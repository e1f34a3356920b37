//! Tests of the drivers' workload bookkeeping.

use super::*;
use crate::workload::mooncake::parse_trace;

#[test]
fn later_turns_extend_an_earlier_context_not_just_the_shared_first_block() {
    let trace = parse_trace(
        std::io::Cursor::new(
            "{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}\n\
             {\"timestamp\": 1, \"input_length\": 900, \"output_length\": 1, \"hash_ids\": [0, 5]}\n\
             {\"timestamp\": 2, \"input_length\": 1600, \"output_length\": 1, \"hash_ids\": [0, 1, 7, 8]}\n\
             {\"timestamp\": 3, \"input_length\": 1300, \"output_length\": 1, \"hash_ids\": [0, 5, 9]}\n",
        ),
        "t.jsonl",
    )
    .unwrap();
    // Request 2 extends request 0's two full blocks; request 3 shares only request 1's partial block.
    assert_eq!(later_turns(&trace), vec![false, false, true, false]);
}
