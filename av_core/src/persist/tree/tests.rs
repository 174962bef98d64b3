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

#[test]
fn a_list_of_one_kind_of_number_is_packed_and_reads_as_the_list() {
    let (float, int) = (Value::Float, Value::Int);
    assert_eq!(
        list(vec![float(1.0), float(-2.5)]),
        Value::Floats(vec![1.0, -2.5])
    );
    assert_eq!(list(vec![int(1), int(-1)]), Value::Ints(vec![1, -1]));
    let unpacked = [
        vec![],
        vec![int(1), float(1.0)],
        vec![float(1.0), int(1)],
        vec![float(1.0), Value::Bool(true)],
        vec![int(0), Value::Bool(false)],
        vec![Value::Bool(true)],
        vec![int(1), Value::None],
    ];
    for items in unpacked {
        assert_eq!(list(items.clone()), Value::List(items));
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Columns {
        n: Vec<u64>,
        x: Vec<f64>,
        o: Vec<Option<f64>>,
        i: Vec<i128>,
    }
    let columns = Columns {
        n: vec![1, u64::MAX],
        x: vec![0.5, f64::NAN],
        o: vec![Some(2.0)],
        i: vec![i128::MIN],
    };
    let tree = to_value(&columns);
    let Value::Dict(fields) = &tree else {
        panic!("{tree:?}")
    };
    assert_eq!(fields[0].1, Value::Ints(vec![1, u64::MAX.into()]));
    assert!(matches!(&fields[1].1, Value::Floats(x) if x[0] == 0.5 && x[1].is_nan()));
    assert_eq!(fields[2].1, Value::Floats(vec![2.0]));
    assert_eq!(fields[3].1, Value::Ints(vec![i128::MIN]));

    // Each column as a packed list and as the list of the same numbers: the same value read,
    // or the same error (the unpacked list's, which the cases above pin down).
    let read = |column: &str, items: Vec<Value>, packed: bool| {
        let items = if packed {
            list(items)
        } else {
            Value::List(items)
        };
        assert_eq!(matches!(items, Value::List(_)), !packed, "{items:?}");
        let mut fields = vec![
            ("n", Value::List(vec![])),
            ("x", Value::List(vec![])),
            ("o", Value::List(vec![])),
            ("i", Value::List(vec![])),
        ];
        fields.iter_mut().find(|(k, _)| *k == column).unwrap().1 = items;
        let fields = fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        from_value::<Columns>(&Value::Dict(fields), "state", ErrorKind::Value)
            .map(|c| format!("{c:?}"))
            .map_err(|e| (e.kind, e.to_string()))
    };
    let cases = [
        ("n", vec![int(1), int(-1)], Err("[\"n\"][1] must be an integer in 0..=18446744073709551615, got -1")),
        ("n", vec![int(2), int(1 << 70)], Err("[\"n\"][1] must be an integer in 0..=18446744073709551615, got 1180591620717411303424")),
        ("n", vec![float(1.0)], Err("[\"n\"][0] must be an integer, got float (1.0)")),
        ("n", vec![int(0), int(u64::MAX.into())], Ok("n: [0, 18446744073709551615]")),
        ("x", vec![int(3), int(-(1 << 60))], Ok("x: [3.0, -1.152921504606847e18]")),
        ("x", vec![float(f64::INFINITY)], Ok("x: [inf]")),
        ("o", vec![float(1.5), float(-0.0)], Ok("o: [Some(1.5), Some(-0.0)]")),
        ("o", vec![int(7)], Ok("o: [Some(7.0)]")),
        ("i", vec![int(i128::MAX), int(-1)], Ok("i: [170141183460469231731687303715884105727, -1]")),
        ("i", vec![float(0.5)], Err("[\"i\"][0] must be an integer, got float (0.5)")),
    ];
    for (column, items, expected) in cases {
        let unpacked = read(column, items.clone(), false);
        assert_eq!(read(column, items, true), unpacked);
        match (unpacked, expected) {
            (Ok(columns), Ok(text)) => assert!(columns.contains(text), "{columns}"),
            (Err((_, message)), Err(text)) => assert_eq!(message, format!("state: {text}")),
            (got, expected) => panic!("{got:?} for {expected:?}"),
        }
    }
    let packed = Value::Dict(vec![("inner".into(), Value::Floats(vec![1.0]))]);
    let err = from_value::<Vec<Columns>>(&packed, "s", ErrorKind::Value).unwrap_err();
    assert_eq!(err.to_string(), "s: must be a list, got dict");
    let err = from_value::<Vec<Columns>>(&Value::Floats(vec![1.0]), "s", ErrorKind::Value);
    assert_eq!(
        err.unwrap_err().to_string(),
        "s: [0] must be a dict, got float"
    );
    let err = from_value::<f64>(&Value::Ints(vec![1]), "s", ErrorKind::Value).unwrap_err();
    assert_eq!(
        (err.kind, err.to_string()),
        (ErrorKind::Type, "s: must be a number, got list".into())
    );
}

/// The list of `items` as a [`ListBuilder`] builds it.
fn list(items: Vec<Value>) -> Value {
    let mut list = ListBuilder::new(items.len());
    items.into_iter().for_each(|item| list.push(item));
    list.finish()
}
