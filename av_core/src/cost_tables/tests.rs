//! Unit tests of the cost tables.

use super::*;
use proptest::prelude::*;

fn curve(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    points.to_vec()
}

#[test]
fn profiled_points_are_reproduced() {
    let verify = curve(&[(1.0, 2.0), (4.0, 3.0), (8.0, 5.0), (16.0, 9.0)]);
    let t = CostTables::from_curves(&verify, &verify, 16, 16, 8).unwrap();
    for &(x, y) in &verify {
        assert_eq!(t.verify_ms()[x as usize], y);
        assert_eq!(t.draft_ms()[x as usize], y);
    }
}

#[test]
fn step_below_limit_linear_above_and_extrapolated() {
    let verify = curve(&[(2.0, 1.0), (4.0, 2.0), (8.0, 4.0), (16.0, 6.0)]);
    let t = CostTables::from_curves(&verify, &verify, 1, 20, 4).unwrap();
    let v = t.verify_ms();
    // Step up to the limit: sizes 0..=2 pay size 2's cost, 3..=4 pay size 4's.
    assert_eq!(&v[0..5], &[1.0, 1.0, 1.0, 2.0, 2.0]);
    // Above the limit: only points above it are blended (8 and 16); 5..=7 sit before the
    // first of them and take its value.
    assert_eq!(&v[5..9], &[4.0, 4.0, 4.0, 4.0]);
    assert_eq!(v[12], 5.0);
    // Past 16: extend the last segment, slope 2/8.
    assert_eq!(v[20], 7.0);
}

#[test]
fn no_limit_means_steps_then_extrapolation() {
    let verify = curve(&[(2.0, 1.0), (4.0, 3.0)]);
    let t = CostTables::from_curves(&verify, &verify, 0, 6, 0).unwrap();
    assert_eq!(t.verify_ms(), &[1.0, 1.0, 1.0, 3.0, 3.0, 4.0, 5.0]);
    assert_eq!(t.draft_ms(), &[1.0]);
}

#[test]
fn running_maximum_and_floors() {
    let draft = curve(&[(1.0, -3.0), (2.0, -5.0)]);
    let verify = curve(&[(1.0, 0.0), (2.0, 0.0)]);
    let t = CostTables::from_curves(&draft, &verify, 3, 3, 0).unwrap();
    assert_eq!(t.draft_ms(), &[0.0; 4]);
    assert_eq!(t.verify_ms(), &[VERIFY_COST_FLOOR_MS; 4]);
    let bumpy = curve(&[(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 7.0)]);
    let t = CostTables::from_curves(&bumpy, &bumpy, 4, 4, 0).unwrap();
    assert_eq!(t.verify_ms(), &[5.0, 5.0, 5.0, 5.0, 7.0]);
}

#[test]
fn single_point_is_constant() {
    let one = curve(&[(8.0, 2.5)]);
    let t = CostTables::from_curves(&one, &one, 3, 20, 4).unwrap();
    assert!(t.verify_ms().iter().all(|&v| v == 2.5));
}

#[test]
fn bad_curves_name_the_argument() {
    let good = curve(&[(1.0, 1.0)]);
    let cases: Vec<(Vec<(f64, f64)>, &str)> = vec![
        (vec![], "empty"),
        (curve(&[(1.0, f64::NAN)]), "finite"),
        (curve(&[(f64::INFINITY, 1.0)]), "finite"),
        (curve(&[(-1.0, 1.0)]), ">= 0"),
        (curve(&[(2.0, 1.0), (2.0, 3.0)]), "strictly increasing"),
        (curve(&[(2.0, 1.0), (1.0, 3.0)]), "strictly increasing"),
    ];
    for (bad, needle) in cases {
        let e = CostTables::from_curves(&good, &bad, 4, 4, 0).unwrap_err();
        assert_eq!(e.argument, "verify_curve");
        assert!(e.message.contains(needle), "{}", e.message);
        let e = CostTables::from_curves(&bad, &good, 4, 4, 0).unwrap_err();
        assert_eq!(e.argument, "draft_curve");
    }
    let e = CostTables::from_curves(&good, &good, 4, MAX_TABLE_LEN, 0).unwrap_err();
    assert_eq!(e.argument, "max_batch_tokens");
}

#[test]
fn explicit_tables_are_validated() {
    assert_eq!(
        CostTables::new(vec![], vec![1.0]).unwrap_err().argument,
        "draft_ms"
    );
    assert_eq!(
        CostTables::new(vec![-1.0], vec![1.0]).unwrap_err().argument,
        "draft_ms"
    );
    assert_eq!(
        CostTables::new(vec![0.0], vec![0.0]).unwrap_err().argument,
        "verify_ms"
    );
    assert_eq!(
        CostTables::new(vec![0.0], vec![f64::NAN])
            .unwrap_err()
            .argument,
        "verify_ms"
    );
    assert!(CostTables::new(vec![0.0], vec![1e-9]).is_ok());
}

#[test]
fn median_per_size() {
    let samples = [
        (4.0, 9.0),
        (2.0, 1.0),
        (4.0, 1.0),
        (2.0, 3.0),
        (4.0, 2.0),
        (2.0, 100.0),
    ];
    assert_eq!(
        median_curve("s", &samples).unwrap(),
        vec![(2.0, 3.0), (4.0, 2.0)]
    );
    let even = [(1.0, 1.0), (1.0, 2.0)];
    assert_eq!(median_curve("s", &even).unwrap(), vec![(1.0, 1.5)]);
    let t = CostTables::from_samples(&samples, &samples, 4, 4, 0).unwrap();
    let expected = CostTables::from_curves(
        &[(2.0, 3.0), (4.0, 2.0)],
        &[(2.0, 3.0), (4.0, 2.0)],
        4,
        4,
        0,
    )
    .unwrap();
    assert_eq!(t, expected);
    assert_eq!(
        CostTables::from_samples(&[], &samples, 4, 4, 0)
            .unwrap_err()
            .argument,
        "draft_samples"
    );
}

#[test]
fn json_round_trip_and_errors() {
    let t = CostTables::new(vec![0.0, 0.1, 1e-300], vec![1e-6, 0.3, 12345.678, 1e22]).unwrap();
    let text = t.to_json();
    assert_eq!(CostTables::from_json(&text).unwrap(), t);
    let spaced = "\n{ \"verify_ms\" : [ 1 , 2.5e0 ] ,\"draft_ms\":[0]}\n";
    let parsed = CostTables::from_json(spaced).unwrap();
    assert_eq!(parsed.verify_ms(), &[1.0, 2.5]);
    for bad in [
        "",
        "{}",
        "{\"draft_ms\": [0]}",
        "{\"draft_ms\": [0], \"verify_ms\": [NaN]}",
        "{\"draft_ms\": [0], \"verify_ms\": [1], \"x\": [1]}",
        "{\"draft_ms\": [0], \"verify_ms\": [1]} extra",
        "{\"draft_ms\": [0], \"draft_ms\": [0], \"verify_ms\": [1]}",
    ] {
        assert_eq!(
            CostTables::from_json(bad).unwrap_err().argument,
            "json",
            "{bad}"
        );
    }
    assert_eq!(
        CostTables::from_json("{\"draft_ms\": [0], \"verify_ms\": [0]}")
            .unwrap_err()
            .argument,
        "verify_ms"
    );
}

fn arb_curve() -> impl Strategy<Value = Vec<(f64, f64)>> {
    prop::collection::vec((1u32..40, 0.0f64..50.0), 1..7).prop_map(|steps| {
        let mut size = 0.0;
        steps
            .into_iter()
            .map(|(gap, cost)| {
                size += f64::from(gap);
                (size, cost)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn tables_are_monotone_and_hit_profiled_maxima(
        curve in arb_curve(), limit in 0usize..120, max_size in 0usize..200
    ) {
        let t = CostTables::from_curves(&curve, &curve, max_size, max_size, limit).unwrap();
        let mut running = f64::NEG_INFINITY;
        for &(x, y) in &curve {
            running = running.max(y);
            if (x as usize) <= max_size {
                prop_assert_eq!(t.verify_ms()[x as usize], running.max(VERIFY_COST_FLOOR_MS));
                prop_assert_eq!(t.draft_ms()[x as usize], running.max(DRAFT_COST_FLOOR_MS));
            }
        }
        for w in t.verify_ms().windows(2) {
            prop_assert!(w[0] <= w[1] + 1e-12 * w[1].abs().max(1.0));
        }
        let back = CostTables::from_json(&t.to_json()).unwrap();
        prop_assert_eq!(back, t);
    }
}
