//! The server API as an OpenAPI 3.1 document (`docs/openapi.json`), generated from the
//! request and answer types the routes really use, so that backends can generate
//! clients that stay right. The committed file is checked by a test; regenerate it with
//! `UPDATE_OPENAPI=1 cargo test -p herald-gateway --lib openapi`.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use super::messages::ServerSendRequest;
use super::sessions::{DisconnectRequest, RevokeRequest, Revoked};
use crate::api::conversations::{Conversation, CreateRequest};
use crate::api::timeline::{MembersRequest, RoleRequest, TitleRequest};
use herald_shared::error::ErrorBody;
use herald_shared::protocol::SendResult;
use herald_shared::service_token::Scope;

/// Where the document is committed, relative to the workspace root.
pub const OPENAPI_PATH: &str = "docs/openapi.json";

/// The generators of request bodies (as the server reads them) and answers (as it
/// writes them); their definitions end up in `components/schemas`.
struct Schemas {
    requests: SchemaGenerator,
    answers: SchemaGenerator,
}

impl Schemas {
    fn new() -> Schemas {
        let settings = || SchemaSettings::draft2020_12().with(|s| s.definitions_path = "/components/schemas".into());
        Schemas {
            requests: settings().for_deserialize().into_generator(),
            answers: settings().for_serialize().into_generator(),
        }
    }

    fn request<T: JsonSchema>(&mut self) -> Value {
        json!({ "required": true, "content": { "application/json": { "schema": self.requests.subschema_for::<T>() } } })
    }

    fn answer<T: JsonSchema>(&mut self, description: &str) -> Value {
        json!({ "description": description, "content": { "application/json": { "schema": self.answers.subschema_for::<T>() } } })
    }

    /// Every definition either side used; a name both use must describe the same thing.
    fn components(mut self) -> Map<String, Value> {
        let mut all = self.requests.take_definitions(true);
        for (name, schema) in self.answers.take_definitions(true) {
            if let Some(old) = all.get(&name) {
                assert_eq!(old, &schema, "`{name}` is described two ways by requests and answers");
            }
            all.insert(name, schema);
        }
        all
    }
}

/// The refusals every route shares, and the ones it adds (`status` → meaning).
fn refusals(s: &mut Schemas, own: &[(&str, &str)]) -> Vec<(String, Value)> {
    let common = [
        ("400", "bad_request: malformed JSON, an unknown field or a field outside its rule (the message names it)"),
        ("401", "unauthorized: no service token, an invalid or expired one, or a device token"),
        ("403", "forbidden: the token lacks the route's scope (the message names it)"),
        ("429", "rate_limited: retry after Retry-After seconds"),
        ("503", "unavailable: retry (sends with the same idempotency key)"),
    ];
    common.iter().chain(own).map(|(status, what)| (status.to_string(), s.answer::<ErrorBody>(what))).collect()
}

fn operation(id: &str, summary: &str, scope: Scope, request: Value, answers: Vec<(String, Value)>) -> Value {
    json!({
        "operationId": id,
        "summary": summary,
        "description": format!("Scope `{}`. docs/protocol.md section 7.", scope.as_str()),
        "security": [{ "serviceToken": [scope.as_str()] }],
        "requestBody": request,
        "responses": Map::from_iter(answers),
    })
}

/// A change of a conversation (`/v1/server/conversations/{id}/...`): its answer is the
/// conversation after the change.
fn change(s: &mut Schemas, (id, summary): (&str, &str), request: Value, own: &[(&str, &str)]) -> Value {
    let mut answers = vec![("200".to_owned(), s.answer::<Conversation>("the conversation after the change"))];
    let not_found = [("404", "not_found: no such conversation in the token's tenant")];
    let own: Vec<(&str, &str)> = not_found.into_iter().chain(own.iter().copied()).collect();
    answers.extend(refusals(s, &own));
    let mut op = operation(id, summary, Scope::ConversationsWrite, request, answers);
    op["parameters"] = json!([{ "name": "id", "in": "path", "required": true, "description": "The conversation's id.", "schema": { "type": "string" } }]);
    op
}

/// The document.
pub fn document() -> Value {
    let mut s = Schemas::new();
    let mut send_answers = vec![("200".to_owned(), s.answer::<SendResult>("committed (dup: true for a repeated key)"))];
    send_answers.extend(refusals(
        &mut s,
        &[
            ("403", "forbidden: the scope is missing, or `as` is not a member of the conversation"),
            ("404", "not_found: no such conversation in the token's tenant"),
            ("409", "conflict: the key was used by `as` for a message to another conversation"),
            ("413", "too_large: the body is over gateway.max_body_bytes"),
        ],
    ));
    let send = operation(
        "sendMessage",
        "Send a message as a member; answered after commit",
        Scope::MessagesSend,
        s.request::<ServerSendRequest>(),
        send_answers,
    );
    let mut create_answers = vec![
        ("201".to_owned(), s.answer::<Conversation>("created")),
        ("200".to_owned(), s.answer::<Conversation>("a repeat: this id exists with the same kind and members")),
    ];
    create_answers.extend(refusals(&mut s, &[("409", "conflict: this id exists with another kind or other members")]));
    let create = operation(
        "createConversation",
        "Create a conversation; its id is the idempotency key",
        Scope::ConversationsWrite,
        s.request::<CreateRequest>(),
        create_answers,
    );
    let members = s.request::<MembersRequest>();
    let members = change(
        &mut s,
        (
            "changeMembers",
            "Add and remove members (events member_added, member_removed); a repeat changes nothing more",
        ),
        members,
        &[("409", "conflict: the members of a direct conversation are fixed")],
    );
    let title = s.request::<TitleRequest>();
    let title = change(
        &mut s,
        ("changeTitle", "Set the title (event title_changed); the same title again changes nothing"),
        title,
        &[("409", "conflict: the title of a direct conversation is fixed")],
    );
    let role = s.request::<RoleRequest>();
    let roles = change(
        &mut s,
        ("changeRole", "Give a member a role (event role_changed); owner hands ownership over"),
        role,
        &[
            ("400", "bad_request: the user is not a member, or a field is outside its rule"),
            ("409", "conflict: a direct conversation has no roles"),
        ],
    );
    let revoked = |s: &mut Schemas, what: &str| {
        let mut answers = vec![("200".to_owned(), s.answer::<Revoked>(what))];
        answers.extend(refusals(s, &[("503", "unavailable: retry (the call is idempotent)")]));
        answers
    };
    let disconnect_answers = revoked(&mut s, "the sessions are closed (4004) on every gateway");
    let disconnect = operation(
        "disconnect",
        "End a user's or a device's sessions now; the tokens they used are refused",
        Scope::SessionsRevoke,
        s.request::<DisconnectRequest>(),
        disconnect_answers,
    );
    let revoke_answers = revoked(&mut s, "tokens issued before not_before are refused from now on");
    let revoke = operation(
        "revokeTokens",
        "Refuse a user's tokens issued before a time, and end the sessions they opened",
        Scope::SessionsRevoke,
        s.request::<RevokeRequest>(),
        revoke_answers,
    );
    let mut read_answers = vec![("200".to_owned(), s.answer::<Conversation>("the conversation and its members"))];
    read_answers.extend(refusals(&mut s, &[("404", "not_found: no such conversation in the token's tenant")]));
    let mut read = operation(
        "getConversation",
        "Read a conversation and its members",
        Scope::ConversationsRead,
        Value::Null,
        read_answers,
    );
    if let Some(op) = read.as_object_mut() {
        op.remove("requestBody");
    }
    read["parameters"] = json!([{ "name": "id", "in": "path", "required": true, "description": "The conversation's id.", "schema": { "type": "string" } }]);
    let scopes: Map<String, Value> = Scope::ALL.iter().map(|sc| (sc.as_str().to_owned(), json!(sc.as_str()))).collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Herald server API",
            "version": "1",
            "description": "For backends and bots with service tokens (docs/protocol.md section 7). \
                Generated from gateway/src/api/server; do not edit by hand.",
        },
        "paths": {
            "/v1/server/messages": { "post": send },
            "/v1/server/conversations": { "post": create },
            "/v1/server/conversations/{id}": { "get": read },
            "/v1/server/conversations/{id}/members": { "post": members },
            "/v1/server/conversations/{id}/title": { "post": title },
            "/v1/server/conversations/{id}/roles": { "post": roles },
            "/v1/server/sessions/disconnect": { "post": disconnect },
            "/v1/server/sessions/revoke": { "post": revoke },
        },
        "components": {
            "securitySchemes": {
                "serviceToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": format!(
                        "A service token: header typ herald-service, claims tid, svc, scopes ({}), exp; \
                         signed by a key trusted for its tenant (docs/protocol.md section 7.1).",
                        scopes.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                },
            },
            "schemas": s.components(),
        },
    })
}

/// The document as committed: pretty JSON with a final newline.
pub fn document_text() -> String {
    let mut text = serde_json::to_string_pretty(&document()).expect("a document serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const REGENERATE: &str = "UPDATE_OPENAPI=1 cargo test -p herald-gateway --lib openapi";

    #[test]
    fn committed_document_is_what_the_types_generate() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(OPENAPI_PATH);
        let expected = document_text();
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &expected).expect("write the document");
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "{OPENAPI_PATH} differs from the server API's types; regenerate it with `{REGENERATE}`"
        );
    }

    /// Every route is described with its scope, and every reference resolves.
    #[test]
    fn document_names_each_route_and_resolves_its_references() {
        let doc = document();
        let text = doc.to_string();
        for path in [
            "/v1/server/messages",
            "/v1/server/conversations",
            "/v1/server/conversations/{id}/members",
            "/v1/server/conversations/{id}/title",
            "/v1/server/conversations/{id}/roles",
        ] {
            assert!(doc["paths"][path]["post"]["security"][0]["serviceToken"][0].is_string(), "{path}");
        }
        for name in text.split("\"#/components/schemas/").skip(1).map(|rest| &rest[..rest.find('"').unwrap()]) {
            assert!(doc["components"]["schemas"][name].is_object(), "{name} is referenced but not defined");
        }
        let send = &doc["components"]["schemas"]["ServerSendRequest"];
        assert_eq!(send["required"], json!(["conv", "as", "body", "idempotency_key"]), "{send}");
    }
}
