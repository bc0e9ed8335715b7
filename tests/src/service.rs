//! Clients of the server API: HTTP clients holding a service token.

use herald_client::HttpClient;
use herald_shared::service_token::{sign_service, Scope, ServiceClaims};

use crate::{Cluster, SERVICE_SECRET};

/// A service token of `tenant`'s service `svc` with `scopes`, valid for an hour.
pub fn service_token(tenant: &str, svc: &str, scopes: &[Scope]) -> String {
    let claims = ServiceClaims {
        tid: tenant.into(),
        svc: svc.into(),
        scopes: scopes.to_vec(),
        exp: herald_shared::ids::now_ms() / 1000 + 3600,
    };
    sign_service(&claims, SERVICE_SECRET.as_bytes())
}

impl Cluster {
    /// A service's HTTP client against gateway `gw`, for the server API.
    pub fn service(&self, gw: usize, tenant: &str, svc: &str, scopes: &[Scope]) -> HttpClient {
        HttpClient::new(self.gateways[gw].base_url(), service_token(tenant, svc, scopes))
    }
}
