//! `herald-loadtest service-token`: mints a service token for the server API
//! (docs/protocol.md section 7.1), for operators and tests.

use std::fmt;

use clap::Args;
use herald_shared::auth::{sign_typed, SERVICE_TYP};
use herald_shared::ids::now_ms;
use herald_shared::service_token::{Scope, ServiceClaims};

#[derive(Debug, Args)]
pub struct ServiceToken {
    /// The service's name ([a-z0-9_-]{1,32}); its sends come from device `service:<name>`.
    #[arg(long)]
    pub service: String,
    /// A scope the token grants: messages:send, conversations:write, conversations:read
    /// or sessions:revoke (repeat for several).
    #[arg(long = "scope", value_name = "SCOPE", required = true, value_parser = scope)]
    pub scopes: Vec<Scope>,
    #[arg(long, default_value = "acme")]
    pub tenant: String,
    /// How long the token is valid, in seconds.
    #[arg(long, default_value_t = 86_400)]
    pub ttl_s: u64,
    /// The `kid` of the key (a trust file's service key with a `kid`); none by default.
    #[arg(long)]
    pub kid: Option<String>,
    /// HS256 secret of service tokens [default: $HERALD_SERVICE_SECRET].
    #[arg(long = "secret", value_name = "S")]
    pub secret: Option<String>,
}

impl ServiceToken {
    /// The signed token, or why there is none.
    pub fn mint(&self) -> Result<String, NoServiceSecret> {
        let secret =
            self.secret.clone().or_else(|| std::env::var("HERALD_SERVICE_SECRET").ok()).ok_or(NoServiceSecret)?;
        let claims = ServiceClaims {
            tid: self.tenant.clone(),
            svc: self.service.clone(),
            scopes: self.scopes.clone(),
            exp: now_ms() / 1000 + self.ttl_s,
        };
        Ok(sign_typed(SERVICE_TYP, self.kid.as_deref(), &claims, secret.as_bytes()))
    }
}

fn scope(s: &str) -> Result<Scope, String> {
    Scope::parse(s).ok_or_else(|| {
        let known: Vec<&str> = Scope::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown scope {s:?}; the scopes are {}", known.join(", "))
    })
}

/// Neither `--secret` nor `HERALD_SERVICE_SECRET` was given.
#[derive(Debug)]
pub struct NoServiceSecret;

impl fmt::Display for NoServiceSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("--secret or HERALD_SERVICE_SECRET is required")
    }
}

impl std::error::Error for NoServiceSecret {}
