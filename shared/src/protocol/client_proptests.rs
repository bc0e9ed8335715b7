//! Property tests of the client frame decoder; `PROPTEST_CASES=100000` runs them longer
//! (docs/reliability.md).

use super::client::*;
use crate::ids::MsgId;
use proptest::prelude::*;
use serde_json::{json, Value};
/// Any JSON value, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{0,6}|t|cmid|ref|conv|ids|seq", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Objects that look like frames: a known or unknown `t` and the fields of any
/// frame type with values of any type.
fn frame_like() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just("cmid"),
        Just("conv"),
        Just("body"),
        Just("ids"),
        Just("seq"),
        Just("after_seq"),
        Just("limit"),
        Just("ref"),
        Just("ts"),
        Just("x"),
    ];
    let t = prop_oneof![
        Just(json!("send")),
        Just(json!("ack")),
        Just(json!("read")),
        Just(json!("sync")),
        Just(json!("ping")),
        Just(json!("dance")),
        json_value(),
    ];
    (proptest::option::of(t), proptest::collection::btree_map(field, json_value(), 0..6)).prop_map(|(t, fields)| {
        let mut o: serde_json::Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        if let Some(t) = t {
            o.insert("t".into(), t);
        }
        Value::Object(o)
    })
}

fn ident() -> impl Strategy<Value = String> {
    "[!-~]{1,64}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = ClientFrame::parse(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn arbitrary_json_ish_text_never_panics(text in r#"[{}\[\]":,. 0-9a-z\\tnulefrs-]{0,96}"#) {
        let _ = ClientFrame::parse(&text);
    }

    /// Any object with frame-like fields parses or is refused with a message; a
    /// readable string `ref` (or `cmid`) is kept on the refusal.
    #[test]
    fn frame_like_objects_parse_or_are_refused_with_their_reference(v in frame_like()) {
        let text = v.to_string();
        if let Err(e) = ClientFrame::parse(&text) {
            prop_assert!(!e.message.is_empty());
            // `ref` wins over `cmid` when it is there and not null.
            let want = match v.get("ref") {
                Some(r) if !r.is_null() => r.as_str(),
                _ => v.get("cmid").and_then(Value::as_str),
            };
            prop_assert_eq!(e.reference.as_deref(), want);
        }
    }

    #[test]
    fn send_frames_round_trip(cmid in ".{1,64}", conv in ident(), body in json_value()) {
        let body_text = body.to_string();
        let text = json!({"t": "send", "cmid": cmid, "conv": conv, "body": body}).to_string();
        match ClientFrame::parse(&text) {
            Ok(ClientFrame::Send(f)) => {
                prop_assert_eq!(f.cmid, cmid);
                prop_assert_eq!(f.conv, conv);
                // The body is kept verbatim, as sent.
                prop_assert_eq!(f.body.get(), body_text.as_str());
            }
            other => prop_assert!(false, "{text} parsed as {other:?}"),
        }
    }

    #[test]
    fn ack_read_sync_and_ping_frames_round_trip(
        ids in proptest::collection::vec(any::<u64>(), 0..16),
        conv in ident(),
        seq in any::<u64>(),
        limit in proptest::option::of(any::<u32>()),
        reference in proptest::option::of(".{0,16}"),
        ts in proptest::option::of(any::<u64>()),
    ) {
        let strs: Vec<String> = ids.iter().map(u64::to_string).collect();
        match ClientFrame::parse(&json!({"t": "ack", "ids": strs}).to_string()) {
            Ok(ClientFrame::Ack(a)) => prop_assert_eq!(a.ids, ids.iter().map(|i| MsgId(*i)).collect::<Vec<_>>()),
            other => prop_assert!(false, "ack: {other:?}"),
        }
        match ClientFrame::parse(&json!({"t": "read", "conv": conv, "seq": seq}).to_string()) {
            Ok(ClientFrame::Read(r)) => prop_assert_eq!((r.conv.as_str(), r.seq), (conv.as_str(), seq)),
            other => prop_assert!(false, "read: {other:?}"),
        }
        let mut sync = json!({"t": "sync", "conv": conv, "after_seq": seq});
        if let Some(l) = limit { sync["limit"] = json!(l); }
        if let Some(r) = &reference { sync["ref"] = json!(r); }
        match ClientFrame::parse(&sync.to_string()) {
            Ok(ClientFrame::Sync(s)) => {
                prop_assert_eq!((s.conv.as_str(), s.after_seq, s.limit), (conv.as_str(), seq, limit));
                prop_assert_eq!(s.reference, reference);
            }
            other => prop_assert!(false, "sync: {other:?}"),
        }
        let mut ping = json!({"t": "ping"});
        if let Some(ts) = ts { ping["ts"] = json!(ts); }
        match ClientFrame::parse(&ping.to_string()) {
            Ok(ClientFrame::Ping(p)) => prop_assert_eq!(p.ts, ts),
            other => prop_assert!(false, "ping: {other:?}"),
        }
    }
}
