//! Service identity: the tokens of backends and bots calling the server API
//! (docs/protocol.md section 7).
//!
//! A service token is a JWT like a device token, but signed with keys of its own
//! (`service_secret`, or a trust file's `"tokens": "service"` issuers, per tenant),
//! marked `typ: herald-service` in its header and carrying a service's name and scopes
//! instead of a user and a device. Each check refuses the other kind, so a device can
//! never call the server API and a service never opens a session.

use serde::{Deserialize, Serialize};

use crate::auth::{is_valid_tenant, sign_typed, AuthError, SERVICE_TYP};
use crate::identity::{KeySet, TokenKind, Verified};
use crate::ids::now_ms;

/// What a service token allows. A route needs one scope; a token holds a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Scope {
    /// Send messages as any member of the tenant's conversations.
    #[serde(rename = "messages:send")]
    MessagesSend,
    /// Create conversations and change their members.
    #[serde(rename = "conversations:write")]
    ConversationsWrite,
    /// End users' and devices' sessions and revoke their tokens (`not_before`).
    #[serde(rename = "sessions:revoke")]
    SessionsRevoke,
    /// Read conversations and their members.
    #[serde(rename = "conversations:read")]
    ConversationsRead,
}

impl Scope {
    pub const ALL: [Scope; 4] =
        [Scope::MessagesSend, Scope::ConversationsWrite, Scope::SessionsRevoke, Scope::ConversationsRead];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::MessagesSend => "messages:send",
            Scope::ConversationsWrite => "conversations:write",
            Scope::SessionsRevoke => "sessions:revoke",
            Scope::ConversationsRead => "conversations:read",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == s)
    }
}

/// The claims of a valid service token: which service of which tenant, allowed what.
/// Other claims (`iat`, `iss`, ... which JWT libraries add) are ignored, as in device
/// tokens; an unknown scope is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceClaims {
    pub tid: String,
    /// The service's name: `[a-z0-9_-]{1,32}`, like a tenant id.
    pub svc: String,
    pub scopes: Vec<Scope>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
}

impl ServiceClaims {
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }

    /// The sender device of the messages this service sends: `service:<name>`, so a
    /// message's `sender_device` tells a service's sends from a device's.
    pub fn sender_device(&self) -> String {
        format!("service:{}", self.svc)
    }
}

/// Mints an HS256 service token (tests and `herald-loadtest service-token`).
pub fn sign_service(claims: &ServiceClaims, secret: &[u8]) -> String {
    sign_typed(SERVICE_TYP, None, claims, secret)
}

/// Checks a service token against one shared secret (`service_secret`).
pub fn verify_service(token: &str, secret: &[u8]) -> Result<ServiceClaims, AuthError> {
    verify_service_at(token, secret, now_ms() / 1000)
}

pub fn verify_service_at(token: &str, secret: &[u8], now_s: u64) -> Result<ServiceClaims, AuthError> {
    service_claims(KeySet::shared_secret(secret, TokenKind::Service).verify_at(token, TokenKind::Service, now_s)?)
}

/// The service claims of a verified token, their formats checked.
pub fn service_claims(verified: Verified) -> Result<ServiceClaims, AuthError> {
    let claims: ServiceClaims = serde_json::from_value(verified.payload).map_err(|_| {
        AuthError::Claims(
            "tid, svc, scopes (of messages:send, conversations:write, conversations:read, sessions:revoke) and exp are required",
        )
    })?;
    if !is_valid_tenant(&claims.tid) {
        return Err(AuthError::Claims("tid must match [a-z0-9_-]{1,32}"));
    }
    if !is_valid_tenant(&claims.svc) {
        return Err(AuthError::Claims("svc must match [a-z0-9_-]{1,32}"));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{sign, Claims, Platform};
    use crate::identity::verify_at;

    fn service() -> ServiceClaims {
        ServiceClaims {
            tid: "acme".into(),
            svc: "helpdesk".into(),
            scopes: vec![Scope::MessagesSend],
            exp: 2_000_000_000,
        }
    }

    fn device() -> Claims {
        Claims {
            tid: "acme".into(),
            sub: "alice".into(),
            dev: "d1".into(),
            plat: Platform::Server,
            exp: 2_000_000_000,
            iat: None,
        }
    }

    #[test]
    fn a_signed_service_token_verifies_with_its_scopes() {
        let t = sign_service(&service(), b"service-secret");
        let c = verify_service_at(&t, b"service-secret", 1_900_000_000).unwrap();
        assert_eq!(c, service());
        assert!(c.allows(Scope::MessagesSend) && !c.allows(Scope::ConversationsWrite));
        assert_eq!(c.sender_device(), "service:helpdesk");
    }

    /// Even signed with the same secret, one kind is never taken for the other.
    #[test]
    fn device_and_service_tokens_are_not_interchangeable() {
        let svc = sign_service(&service(), b"same-secret");
        assert!(matches!(verify_at(&svc, b"same-secret", 0), Err(AuthError::WrongKind(_))));
        let dev = sign(&device(), b"same-secret");
        assert!(matches!(verify_service_at(&dev, b"same-secret", 0), Err(AuthError::WrongKind(_))));
    }

    #[test]
    fn wrong_secret_expiry_unknown_scopes_and_bad_names_are_refused() {
        let t = sign_service(&service(), b"service-secret");
        assert_eq!(verify_service_at(&t, b"other", 0), Err(AuthError::Signature));
        assert_eq!(verify_service_at(&t, b"service-secret", 2_000_000_000), Err(AuthError::Expired));
        let bad = ServiceClaims { svc: "Help Desk".into(), ..service() };
        assert!(matches!(verify_service_at(&sign_service(&bad, b"s"), b"s", 0), Err(AuthError::Claims(_))));
        let unknown = serde_json::json!({"tid": "acme", "svc": "x", "scopes": ["admin:all"], "exp": 2_000_000_000u64});
        let t = sign_typed(SERVICE_TYP, None, &unknown, b"s");
        assert!(matches!(verify_service_at(&t, b"s", 0), Err(AuthError::Claims(_))));
        let with_iat = serde_json::json!({"tid": "acme", "svc": "x", "scopes": [], "exp": 2_000_000_000u64, "iat": 1});
        let t = sign_typed(SERVICE_TYP, None, &with_iat, b"s");
        assert!(verify_service_at(&t, b"s", 1_900_000_000).is_ok(), "claims JWT libraries add are ignored");
    }

    #[test]
    fn scopes_parse_from_their_names() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
            assert_eq!(serde_json::to_value(scope).unwrap(), scope.as_str());
        }
        assert_eq!(Scope::parse("messages"), None);
    }
}
