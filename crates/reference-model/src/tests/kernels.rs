//! The kernels alone: the portable `exp` against the platform's, greedy ties, dot products with a tail.

use super::super::kernels::{argmax, dot, exp};

#[test]
fn exp_is_within_a_few_ulps_of_the_platform_exp() {
    let mut worst = 0.0f64;
    for i in -87_000..=88_000 {
        let x = i as f32 / 1000.0;
        let expected = f64::from(x).exp();
        let relative = ((f64::from(exp(x)) - expected) / expected).abs();
        worst = worst.max(relative);
    }
    assert!(worst < 5e-7, "worst relative error {worst:e}");
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-1000.0), exp(-87.0));
    assert!(exp(-1000.0) > 0.0);
    assert!(exp(1000.0).is_finite());
}

#[test]
fn greedy_ties_go_to_the_lowest_token_and_nan_never_wins() {
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
    assert_eq!(argmax(&[f32::NAN, -1.0, -1.0]), Some(1));
    assert_eq!(argmax(&[f32::NAN]), None);
    assert_eq!(argmax(&[]), None);
}

#[test]
fn dot_covers_the_tail() {
    let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
    let b = vec![1.0f32; 19];
    assert_eq!(dot(&a, &b), 171.0);
}
