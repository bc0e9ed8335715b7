//! Property tests of the create bodies and member lists: any JSON parses or is refused with
//! `bad_request`, never a panic; `PROPTEST_CASES=100000` runs them longer.

use super::*;
use crate::api::body_strategies::fields_of;
use proptest::prelude::*;

fn strings(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
}

fn opt_string(v: Option<&Value>) -> bool {
    v.is_none_or(|v| v.is_null() || v.is_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_are_refused_as_bad_request(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Some(e) = parse_json::<CreateRequest>(&bytes).err() {
            prop_assert_eq!(e.code, ErrorCode::BadRequest);
        }
    }

    #[test]
    fn create_bodies_parse_exactly_when_well_typed(v in fields_of(&["id", "kind", "members", "title", "extra"])) {
        let o = v.as_object().unwrap();
        let ok = !o.contains_key("extra")
            && o.get("kind").is_some_and(Value::is_string)
            && o.get("members").is_some_and(strings)
            && opt_string(o.get("id"))
            && opt_string(o.get("title"));
        match parse_json::<CreateRequest>(v.to_string().as_bytes()) {
            Ok(req) => {
                prop_assert!(ok, "accepted {v}");
                // Member validation refuses or accepts without panicking.
                match check_members(&req.members, 3) {
                    Ok(set) => prop_assert!(set.len() <= 3 && set.iter().all(|m| is_valid_ident(m))),
                    Err(e) => prop_assert_eq!(e.code, ErrorCode::BadRequest),
                }
            }
            Err(e) => {
                prop_assert!(!ok, "refused {v}: {}", e.message);
                prop_assert_eq!(e.code, ErrorCode::BadRequest);
            }
        }
    }

    #[test]
    fn member_lists_are_checked(members in proptest::collection::vec(".{0,70}", 0..8), max in 2usize..6) {
        let set: BTreeSet<&String> = members.iter().collect();
        let valid = set.iter().all(|m| is_valid_ident(m));
        match check_members(&members, max) {
            Ok(out) => prop_assert!(valid && out.len() == set.len() && out.len() <= max),
            Err(e) => {
                prop_assert_eq!(e.code, ErrorCode::BadRequest);
                prop_assert!(!valid || set.len() > max);
            }
        }
    }
}
