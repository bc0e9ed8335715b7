//! The wire protocol as one JSON Schema (`docs/protocol.schema.json`), generated from
//! [`ServerFrame`] and [`ClientFrame`] so that clients in other languages are checked
//! against the types the server really uses (the TypeScript client's tests read it).
//!
//! Server frames are described as the server writes them (a `null` `ref` is present,
//! fields it skips when empty are optional); client frames as the server reads them
//! (fields with a default may be left out). The committed file is checked by a test;
//! regenerate it with `UPDATE_SCHEMA=1 cargo test -p herald-shared --lib protocol::schema`.

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::{ClientFrame, ServerFrame, SUBPROTOCOL};

/// Where the schema is committed, relative to the workspace root.
pub const SCHEMA_PATH: &str = "docs/protocol.schema.json";

/// One type's root schema, moved under `$defs/<name>`, with the definitions it uses
/// added to `defs` (a name already there must describe the same thing).
fn add<T: JsonSchema>(settings: SchemaSettings, name: &str, defs: &mut Map<String, Value>) {
    let mut root = settings.into_generator().into_root_schema_for::<T>().to_value();
    let obj = root.as_object_mut().expect("a root schema is an object");
    obj.remove("$schema");
    let own = match obj.remove("$defs") {
        Some(Value::Object(own)) => own,
        _ => Map::new(),
    };
    for (k, v) in own.into_iter().chain([(name.to_owned(), root)]) {
        if let Some(old) = defs.get(&k) {
            assert_eq!(old, &v, "`{k}` is described two ways by the server and client frames");
        }
        defs.insert(k, v);
    }
}

/// The schema of every frame either side sends.
pub fn wire_schema() -> Value {
    let mut defs = Map::new();
    add::<ServerFrame>(SchemaSettings::draft2020_12().for_serialize(), "ServerFrame", &mut defs);
    add::<ClientFrame>(SchemaSettings::draft2020_12().for_deserialize(), "ClientFrame", &mut defs);
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": format!("Herald wire protocol ({SUBPROTOCOL})"),
        "description": "Every WebSocket frame of docs/protocol.md section 3: ServerFrame as the server \
            sends it, ClientFrame as the server accepts it. Generated from the Rust types in \
            shared/src/protocol; do not edit by hand.",
        "anyOf": [{ "$ref": "#/$defs/ServerFrame" }, { "$ref": "#/$defs/ClientFrame" }],
        "$defs": defs,
    })
}

/// The schema as committed: pretty JSON with a final newline.
pub fn wire_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&wire_schema()).expect("a schema serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const REGENERATE: &str = "UPDATE_SCHEMA=1 cargo test -p herald-shared --lib protocol::schema";

    #[test]
    fn committed_schema_is_what_the_types_generate() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(SCHEMA_PATH);
        let expected = wire_schema_text();
        if std::env::var_os("UPDATE_SCHEMA").is_some() {
            std::fs::write(&path, &expected).expect("write the schema");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{SCHEMA_PATH} differs from the wire types (shared/src/protocol); regenerate it with `{REGENERATE}`"
        );
    }

    /// Every frame kind is in the schema with its `t`, and the wire details the
    /// serde attributes make are described: ids as strings, optional and nullable fields.
    #[test]
    fn schema_describes_tags_ids_and_optional_fields() {
        let s = wire_schema();
        let tags = |name: &str| -> Vec<String> {
            s["$defs"][name]["oneOf"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["properties"]["t"]["const"].as_str().unwrap().to_owned())
                .collect()
        };
        let server = tags("ServerFrame");
        assert_eq!(server.len(), 13, "{server:?}");
        assert!(server.contains(&"caught_up".to_owned()));
        assert_eq!(
            tags("ClientFrame"),
            ["send", "ack", "read", "sync", "ping", "auth", "refresh", "typing", "presence_subscribe"]
        );
        assert_eq!(s["$defs"]["MsgId"]["type"], "string");
        let required = |name: &str| s["$defs"][name]["required"].as_array().unwrap().clone();
        assert!(required("PresenceState").contains(&json!("last_seen")), "last_seen is always sent (null)");
        assert!(required("History").contains(&json!("ref")), "history's ref is always sent (null)");
        assert!(!required("History").contains(&json!("joined_seq")));
        assert!(!required("ErrorFrame").contains(&json!("ref")));
        assert!(!required("SyncFrame").contains(&json!("after_seq")), "the server defaults after_seq");
        assert_eq!(s["$defs"]["History"]["properties"]["ref"]["type"], json!(["string", "null"]));
        assert_eq!(s["$defs"]["ErrorCode"]["enum"].as_array().unwrap().len(), 9);
    }
}
