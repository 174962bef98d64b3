use super::*;

fn sample() -> Value {
    Value::Dict(vec![
        ("none".into(), Value::None),
        (
            "flags".into(),
            Value::List(vec![Value::Bool(false), Value::Bool(true)]),
        ),
        (
            "ints".into(),
            Value::List(vec![
                Value::Int(i128::MIN),
                Value::Int(-1),
                Value::Int(i128::MAX),
            ]),
        ),
        (
            "floats".into(),
            Value::List(vec![
                Value::Float(-0.0),
                Value::Float(f64::INFINITY),
                Value::Float(f64::MIN_POSITIVE / 3.0),
                Value::Float(f64::from_bits(0x7FF8_0000_0000_0001)),
            ]),
        ),
        ("text".into(), Value::Str("é\u{0}\"".into())),
        (
            "nested".into(),
            Value::Dict(vec![("x".into(), Value::Dict(vec![]))]),
        ),
        (
            "binding".into(),
            Value::List(vec![
                Value::BigInt {
                    text: "10**400".into(),
                    float: None,
                },
                Value::Other {
                    type_name: "set".into(),
                    text: "{1}".into(),
                },
            ]),
        ),
    ])
}

fn bits_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| bits_equal(x, y))
        }
        (Value::Dict(x), Value::Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k, x), (l, y))| k == l && bits_equal(x, y))
        }
        _ => a == b,
    }
}

#[test]
fn bytes_round_trip_every_value_bit_for_bit() {
    let mut bytes = Vec::new();
    encode(&sample(), &mut bytes);
    assert!(bits_equal(&decode(&bytes).unwrap(), &sample()));
}

#[test]
fn broken_bytes_are_refused_naming_data() {
    let mut bytes = Vec::new();
    encode(&sample(), &mut bytes);
    for cut in 0..bytes.len() {
        let err = decode(&bytes[..cut]).unwrap_err();
        assert_eq!((err.kind, err.argument), (ErrorKind::State, "data"));
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(decode(&padded)
        .unwrap_err()
        .message
        .contains("unexpected bytes"));
    assert!(decode(&[42])
        .unwrap_err()
        .message
        .contains("unknown value tag 42"));
    // A length the data cannot hold is refused before anything is allocated.
    let mut huge = vec![6];
    huge.extend(u64::MAX.to_le_bytes());
    assert!(decode(&huge)
        .unwrap_err()
        .message
        .contains("exceeds the data"));
    let mut twice = Vec::new();
    let key = ("k".to_string(), Value::None);
    encode(&Value::Dict(vec![key.clone(), key]), &mut twice);
    assert!(decode(&twice)
        .unwrap_err()
        .message
        .contains("appears twice"));
    let mut deep = Value::None;
    for _ in 0..=MAX_DEPTH + 1 {
        deep = Value::List(vec![deep]);
    }
    let mut nested = Vec::new();
    encode(&deep, &mut nested);
    assert!(decode(&nested).unwrap_err().message.contains("nest deeper"));
}

#[test]
fn scalars_are_described_as_python_prints_them() {
    let float = |v: f64| describe(Unexpected::Float(v));
    assert_eq!(float(2.0), "float (2.0)");
    assert_eq!(float(-0.5), "float (-0.5)");
    assert_eq!(float(f64::INFINITY), "float (inf)");
    assert_eq!(float(f64::NEG_INFINITY), "float (-inf)");
    assert_eq!(float(f64::NAN), "float (nan)");
    assert_eq!(describe(Unexpected::Bool(true)), "bool (True)");
    assert_eq!(describe(Unexpected::Str("x")), "str (\"x\")");
}

#[test]
fn readers_name_the_argument_the_path_and_the_kind() {
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        n: Vec<u64>,
        x: f64,
        o: Option<u32>,
    }
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
    }
    let read = |inner: Vec<(&str, Value)>| {
        let inner = inner.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let tree = Value::Dict(vec![("inner".into(), Value::Dict(inner))]);
        from_value::<Outer>(&tree, "state", ErrorKind::Value).map(|_| ())
    };
    let ok = || {
        vec![
            ("n", Value::List(vec![Value::Int(1)])),
            ("x", Value::Int(3)),
            ("o", Value::None),
        ]
    };
    assert!(read(ok()).is_ok()); // an int is a number
    let mut cases = Vec::new();
    let mut bad = ok();
    bad[0].1 = Value::List(vec![Value::Int(1), Value::Int(-1)]);
    cases.push((
        bad,
        ErrorKind::Value,
        "state: [\"inner\"][\"n\"][1] must be an integer in 0..=18446744073709551615, got -1",
    ));
    let mut bad = ok();
    bad[1].1 = Value::Bool(true);
    cases.push((
        bad,
        ErrorKind::Type,
        "state: [\"inner\"][\"x\"] must be a number, got bool (True)",
    ));
    let mut bad = ok();
    bad[2].1 = Value::Int(1 << 40);
    cases.push((
        bad,
        ErrorKind::Value,
        "state: [\"inner\"][\"o\"] must be an integer in 0..=4294967295, got 1099511627776",
    ));
    let mut bad = ok();
    bad[1].1 = Value::Other {
        type_name: "object".into(),
        text: "<object>".into(),
    };
    cases.push((
        bad,
        ErrorKind::Type,
        "state: [\"inner\"][\"x\"] must be a number, got object (<object>)",
    ));
    let mut bad = ok();
    bad[0].1 = Value::List(vec![Value::Int(1 << 70)]);
    cases.push((bad, ErrorKind::Value, "state: [\"inner\"][\"n\"][0] must be an integer in 0..=18446744073709551615, got 1180591620717411303424"));
    let mut bad = ok();
    bad.remove(1);
    cases.push((
        bad,
        ErrorKind::Value,
        "state: [\"inner\"][\"x\"] is missing",
    ));
    let mut bad = ok();
    bad.push(("y", Value::None));
    cases.push((
        bad,
        ErrorKind::Value,
        "state: [\"inner\"][\"y\"] is not a field (the fields: n, x, o)",
    ));
    for (inner, kind, message) in cases {
        let err = read(inner).unwrap_err();
        assert_eq!((err.kind, err.to_string()), (kind, message.to_string()));
    }
    let err = from_value::<Outer>(&Value::List(vec![]), "state", ErrorKind::State).unwrap_err();
    assert_eq!(
        (err.kind, err.to_string()),
        (ErrorKind::Type, "state: must be a dict, got list".into())
    );
}
