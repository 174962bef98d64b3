use super::*;

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
