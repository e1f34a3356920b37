//! Tests of the seconds conversion: every hostile number is refused with what is allowed.

use super::*;

#[test]
fn seconds_in_range_convert() {
    assert_eq!(duration_s(0.0, false), Ok(Duration::ZERO));
    assert_eq!(duration_s(-0.0, false), Ok(Duration::ZERO));
    assert_eq!(duration_s(2.5, true), Ok(Duration::from_millis(2500)));
    assert_eq!(
        duration_s(SECONDS_MAX, true),
        Ok(Duration::from_secs(1_000_000_000))
    );
}

#[test]
fn hostile_seconds_are_refused_with_what_is_allowed() {
    for bad in [
        -1.0,
        -0.0001,
        1e300,
        SECONDS_MAX * 1.000_001,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
    ] {
        assert_eq!(duration_s(bad, false), Err(SECONDS_ALLOWED), "{bad}");
        assert_eq!(
            duration_s(bad, true),
            Err(POSITIVE_SECONDS_ALLOWED),
            "{bad}"
        );
    }
    assert_eq!(duration_s(0.0, true), Err(POSITIVE_SECONDS_ALLOWED));
}

#[test]
fn huge_numbers_show_in_exponent_form() {
    assert_eq!(show(1e300), "1e300");
    assert_eq!(show(-1e20), "-1e20");
    assert_eq!(show(2.5), "2.5");
    assert_eq!(show(1e9), "1000000000");
    assert_eq!(show(f64::NAN), "NaN");
    assert_eq!(show(f64::NEG_INFINITY), "-inf");
}
