//! Tests of the tidy parsers: contract ids of the specification, rows and test references of
//! `docs/contract.md`, test function names of Rust sources, and which files are integration tests.

use super::contract::{TestRef, extends_a_family, row_refs, spec_ids, test_fns, test_refs};

fn test_ref(file: &str, test: &str) -> TestRef {
    TestRef {
        file: file.to_string(),
        test: test.to_string(),
    }
}

#[test]
fn spec_ids_are_the_bold_ids_of_list_items_in_order() {
    let spec = "\
# Contract
- **Page**: a term, not an id
- **R1** Reserve takes pages, slot and credits.
- **R2** The preflight counts **C1** credits.
  - **R10** nested items count too
* **Q8** starred items count
- **R1** listed again is one id
Text with **X1** in the middle is no item.
- **rx** lower case is no id
";
    assert_eq!(spec_ids(spec), ["R1", "R2", "R10", "Q8"]);
}

#[test]
fn a_row_may_extend_a_family_of_the_specification_past_its_last_id() {
    let ids: Vec<String> = ["H1", "H8", "R10", "Q8"].map(String::from).to_vec();
    assert!(extends_a_family(&ids, "H9"));
    assert!(extends_a_family(&ids, "R11"));
    assert!(
        !extends_a_family(&ids, "H8"),
        "already an id of the specification"
    );
    assert!(
        !extends_a_family(&ids, "H2"),
        "inside the family: a typo or a stale row"
    );
    assert!(!extends_a_family(&ids, "Z1"), "no such family");
    assert!(!extends_a_family(&ids, "HX"), "no number");
}

#[test]
fn rows_are_table_lines_whose_first_cell_is_an_id() {
    let doc = "\
| id | behaviour | pinned by |
|---|---|---|
| R1 | all or nothing | `crates/a/src/tests.rs::r1_x`, `tests/e2e/b.rs::r1_y` |
| **C4** | windows | `crates/c/src/tests.rs::c4_z` |
| W1 | no test named yet | `Ledger::reserve` |
| test | property |
| `crates/a/src/tests.rs::prop_p` | a property row has no id |
";
    let rows = row_refs(doc);
    assert_eq!(rows.keys().collect::<Vec<_>>(), ["C4", "R1", "W1"]);
    assert_eq!(
        rows["R1"],
        [
            test_ref("crates/a/src/tests.rs", "r1_x"),
            test_ref("tests/e2e/b.rs", "r1_y")
        ]
    );
    assert_eq!(rows["C4"], [test_ref("crates/c/src/tests.rs", "c4_z")]);
    assert!(rows["W1"].is_empty(), "a type path is no test reference");
}

#[test]
fn test_refs_are_code_spans_naming_a_rust_file_and_a_function() {
    let text = "see `a/b.rs::t_1` and `c.rs::` and `d.rs::x y` and `Ledger::reserve` and \
                `e.rs::9x` and ` f.rs::g ` and `grep -rn \"fn c4_\"` but not a.rs::bare";
    assert_eq!(
        test_refs(text),
        [test_ref("a/b.rs", "t_1"), test_ref("f.rs", "g")]
    );
}

#[test]
fn test_fns_are_functions_under_a_test_attribute() {
    let source = r#"
//! A module.

fn helper_q8_step_work() {}

#[test]
fn r1_plain() {}

/// Doc comment between.
#[test]
#[allow(
    clippy::print_stderr,
    reason = "a multi-line attribute"
)]
fn agents_side_by_side() {
    let x = 1;
}

#[tokio::test]
async fn async_test() {}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The property.
    #[test]
    fn prop_model(ops in ops()) {
        run(ops);
    }
}

#[cfg(test)]
mod tests;

#[test]
const NOT_A_FN: u32 = 1;
fn after_an_item() {}
"#;
    assert_eq!(
        test_fns(source),
        [
            "r1_plain",
            "agents_side_by_side",
            "async_test",
            "prop_model"
        ]
    );
}

#[test]
fn integration_tests_are_the_files_beside_each_test_binarys_main() {
    use super::is_integration_test;
    assert!(is_integration_test("tests/e2e/agents.rs"));
    assert!(is_integration_test("crates/engine/tests/it/contract.rs"));
    assert!(!is_integration_test("tests/e2e/main.rs"));
    assert!(!is_integration_test("crates/engine/tests/it/main.rs"));
    assert!(!is_integration_test("crates/kvgate/src/config/tests.rs"));
}

#[test]
fn library_code_is_src_without_binaries_and_tests() {
    use super::fn_length::is_library;
    assert!(is_library("crates/engine/src/engine/step.rs"));
    assert!(!is_library("crates/kvgate/src/main.rs"));
    assert!(!is_library("crates/kvgate/src/bin/capacity_waits.rs"));
    assert!(!is_library("crates/engine/src/tests.rs"));
    assert!(!is_library("crates/engine/src/engine/tests/admit.rs"));
    assert!(!is_library("crates/engine/tests/it/cuda.rs"));
    assert!(!is_library("crates/kv-pool/benches/pool.rs"));
    assert!(!is_library("xtask/src/main.rs"));
}

#[test]
fn braces_in_comments_strings_and_chars_do_not_count() {
    use super::fn_length::code_only;
    let text = "let a = \"{\"; // {\nlet b = '{'; /* { */ let c = r#\"{\"#; fn f<'a>(x: &'a u8) {}";
    let code = code_only(text);
    assert_eq!(code.matches('{').count(), 1, "{code}");
    assert_eq!(code.lines().count(), 2);
}

#[test]
fn a_function_over_the_limit_is_reported_with_its_line_and_length() {
    use super::fn_length::{MAX_FN_LINES, long_functions};
    let body = "    x += 1;\n".repeat(MAX_FN_LINES - 2);
    let at_limit = format!("fn fits() {{\n{body}}}\n");
    assert!(long_functions(&at_limit).is_empty());
    let over = format!("//! doc\npub(crate) fn grows(x: [u8; 2]) {{\n{body}    x;\n}}\n");
    assert_eq!(
        long_functions(&over),
        [(2, "grows".to_string(), MAX_FN_LINES + 1)]
    );
    let tested = format!("#[cfg(test)]\nmod tests {{\n{over}}}\n");
    assert!(long_functions(&tested).is_empty());
}
