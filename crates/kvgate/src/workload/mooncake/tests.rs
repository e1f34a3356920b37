//! Tests of the trace reader (every malformed line names its number) and the theoretical maximum hit.

use std::sync::Arc;

use kv_pool::{BlockKey, Timestamp};

use super::*;

fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    parse_trace(std::io::Cursor::new(text), "t.jsonl")
}

#[test]
fn reads_records_and_builds_prompts_of_their_length() {
    let trace = parse(
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 3, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    assert_eq!(trace.len(), 2);
    let (a, b) = (trace[0].prompt(), trace[1].prompt());
    assert_eq!(a.len(), 600);
    assert_eq!(b.len(), 512);
    assert_eq!(a[..512], b[..], "equal hash ids give equal blocks");
}

/// A prompt has room for its output, but never more than its own length again: the largest output length a
/// trace can state allocates nothing extra.
#[test]
fn a_prompt_has_room_for_its_output_up_to_its_own_length() {
    let trace = parse(&format!(
        "{{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}}\n\
         {{\"timestamp\": 0, \"input_length\": 600, \"output_length\": {}, \"hash_ids\": [1, 2]}}\n",
        u32::MAX
    ))
    .unwrap();
    let (short, huge) = (trace[0].prompt(), trace[1].prompt());
    assert_eq!(short, huge);
    assert!(short.capacity() >= 605, "{}", short.capacity());
    assert!(
        huge.capacity() >= 1200 && huge.capacity() < 1300,
        "{}",
        huge.capacity()
    );
}

#[test]
fn theoretical_max_counts_leading_seen_blocks_capped_at_input() {
    let trace = parse(
        "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 1, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [1, 2, 3]}\n\
         {\"timestamp\": 2, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 9]}\n\
         {\"timestamp\": 3, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    // 0 + 1024 + 512 + min(1024, 1000)
    assert_eq!(theoretical_max_hit_tokens(&trace), (2536, 3824));
}

#[test]
fn malformed_json_names_its_line() {
    let err = parse(
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{oops\n",
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("t.jsonl:2: "), "{message}");
}

#[test]
fn inconsistent_hash_blocks_are_rejected() {
    let err = parse(
        "{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [1, 2]}",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "t.jsonl:1: input_length 1025 needs 3 hash blocks of 512 tokens, got 2"
    );
}

#[test]
fn zero_input_unknown_field_and_disorder_are_rejected() {
    let zero =
        parse("{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}");
    assert_eq!(
        zero.unwrap_err().to_string(),
        "t.jsonl:1: input_length must be at least 1"
    );
    let unknown = parse(
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1], \"x\": 1}",
    );
    assert!(
        unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `x`")
    );
    let disorder = parse(
        "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
         {\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}",
    );
    assert!(
        disorder
            .unwrap_err()
            .to_string()
            .starts_with("t.jsonl:2: timestamp 4 is earlier")
    );
}

#[test]
fn empty_trace_and_missing_file_are_errors() {
    assert_eq!(
        parse("\n\n").unwrap_err().to_string(),
        "trace t.jsonl holds no request"
    );
    let missing = read_trace(Path::new("/nonexistent/trace.jsonl")).unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("cannot read trace /nonexistent/trace.jsonl: ")
    );
}

#[test]
fn a_generated_trace_reads_from_a_file_and_has_a_bounded_maximum() {
    let shape = generate::TraceShape {
        n_requests: 200,
        ..generate::TraceShape::default()
    };
    let trace = generate::generate(&shape).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generated.jsonl");
    std::fs::write(&path, generate::to_jsonl(&trace)).unwrap();
    let read = read_trace(&path).unwrap();
    assert_eq!(read, trace);
    let (hit, total) = theoretical_max_hit_tokens(&read);
    let input: u64 = read.iter().map(|r| u64::from(r.input_length)).sum();
    assert_eq!(total, input);
    assert!(hit > 0 && hit < total, "{hit} of {total}");
    let pct = theoretical_max_hit_pct(&read);
    assert!(
        (pct - 100.0 * hit as f64 / total as f64).abs() < 1e-9,
        "{pct}"
    );
}

#[test]
fn a_70_mb_line_is_refused_without_reading_it_whole() {
    // The reader yields 70 MB lazily: the parser must stop at the limit, not allocate the line.
    let huge = std::io::BufReader::new(std::io::repeat(b' ').take(70 << 20));
    let error = parse_trace(huge, "t.jsonl").unwrap_err().to_string();
    assert_eq!(
        error,
        "t.jsonl:1: the line is longer than the limit of 1048576 bytes"
    );
    let first_fine = std::io::Cursor::new(
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n",
    )
    .chain(std::io::repeat(b'[').take(2 << 20));
    let error = parse_trace(std::io::BufReader::new(first_fine), "t.jsonl").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("t.jsonl:2: the line is longer"),
        "{error}"
    );
}

#[test]
fn a_line_of_exactly_the_limit_is_read() {
    let record = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}";
    let padding = " ".repeat(crate::limits::TRACE_LINE_BYTES_MAX - record.len());
    let padded = format!("{record}{padding}\n");
    assert_eq!(parse(&padded).unwrap().len(), 1);
}

#[test]
fn huge_lengths_and_timestamps_are_refused_naming_the_limit() {
    let line = |timestamp: u64, input_length: u64| {
        format!(
            "{{\"timestamp\": {timestamp}, \"input_length\": {input_length}, \"output_length\": 1, \"hash_ids\": [1]}}"
        )
    };
    assert_eq!(
        parse(&line(0, 4_294_967_295)).unwrap_err().to_string(),
        "t.jsonl:1: input_length 4294967295 is above the limit of 16777216 tokens"
    );
    assert_eq!(
        parse(&line(u64::MAX, 1)).unwrap_err().to_string(),
        "t.jsonl:1: timestamp 18446744073709551615 ms is above the limit of 1000000000000 ms"
    );
    assert!(
        parse(&line(0, 4_294_967_296))
            .unwrap_err()
            .to_string()
            .contains("invalid value: integer `4294967296`")
    );
    assert!(
        parse(&line(0, 1).replace("\"timestamp\": 0", "\"timestamp\": -1"))
            .unwrap_err()
            .to_string()
            .starts_with("t.jsonl:1: invalid value: integer `-1`")
    );
}

#[test]
fn a_line_that_is_not_utf8_names_its_line() {
    let mut bytes =
        b"{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\r\n"
            .to_vec();
    bytes.extend_from_slice(b"{\"timestamp\": 1, \xff\xfe}\n");
    let err = parse_trace(std::io::Cursor::new(bytes), "t.jsonl").unwrap_err();
    assert!(matches!(&err, TraceError::Line { line: 2, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "t.jsonl:2: not UTF-8 text (invalid byte at column 18); a trace is JSON lines"
    );
}

/// A trace request's segments are what `generate` makes of its hash ids: keyed by them, any two requests of a
/// trace (shared prefixes, later turns, partial last blocks) share as many leading keys as their generated
/// prompts' token chains do; with blocks that do not divide a trace block the keys are the chain's.
#[test]
fn trace_segments_share_the_prefixes_the_tokens_share() {
    let common =
        |a: &[BlockKey], b: &[BlockKey]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for reuse in [generate::Reuse::High, generate::Reuse::Low] {
        let shape = generate::TraceShape {
            n_requests: 120,
            reuse,
            ..generate::TraceShape::default()
        };
        let trace = generate::generate(&shape).unwrap();
        for block_tokens in [16, 48] {
            let keyed: Vec<(Vec<BlockKey>, Vec<BlockKey>)> = trace
                .iter()
                .enumerate()
                .map(|(idx, request)| {
                    let keyed =
                        engine::RequestSpec::new(idx as u64, Vec::new(), 1, Timestamp::ZERO)
                            .keyed_from_source(block_tokens, Arc::new(request.clone()))
                            .unwrap();
                    let chained =
                        BlockKey::chain_all(&request.prompt(), block_tokens as usize, b"");
                    (keyed.keys().to_vec(), chained)
                })
                .collect();
            let mut shared = 0;
            for (i, a) in keyed.iter().enumerate() {
                assert_eq!(a.0.len(), a.1.len(), "request {i}");
                assert_eq!(
                    a.0 == a.1,
                    block_tokens == 48 || a.0.is_empty(),
                    "request {i}"
                );
                for b in &keyed[..i] {
                    assert_eq!(common(&a.0, &b.0), common(&a.1, &b.1), "request {i}");
                    shared += common(&a.0, &b.0);
                }
            }
            assert!(shared > 0, "the trace shares prefixes");
        }
        // What a request holds is generated from where it starts: the end of what `generate` makes.
        for request in trace.iter().take(20) {
            let prompt = request.prompt();
            for start in [
                0,
                1,
                511,
                512,
                513,
                prompt.len() - 1,
                prompt.len(),
                prompt.len() + 9,
            ] {
                let mut from = vec![7];
                engine::PromptSource::generate_from(request, start, &mut from);
                assert_eq!(
                    from[1..],
                    *prompt.get(start..).unwrap_or_default(),
                    "from {start}"
                );
            }
        }
    }
}
