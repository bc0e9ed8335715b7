//! Proptest strategies for request bodies: any JSON value, and objects whose fields are
//! drawn from a body type's names with values of any type.

use proptest::prelude::*;
use serde_json::Value;

/// Any JSON value, nested a few levels; strings and numbers that look like ids or seqs
/// come up often.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(Value::from),
        "[!-~]{1,8}".prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{0,4}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Objects with any subset of `names`, each with a value of any type; string arrays
/// (member lists) are common.
pub fn fields_of(names: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let value = prop_oneof![
        3 => json_value(),
        1 => proptest::collection::vec("[!-~]{1,8}", 0..4).prop_map(Value::from),
    ];
    proptest::collection::btree_map(proptest::sample::select(names), value, 0..=names.len())
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
}
