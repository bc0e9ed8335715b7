//! Who may sign tokens for whom: key sets and their verification (docs/protocol.md
//! section 1.1, docs/operations.md "Identity").
//!
//! A token is checked against a [`KeySet`]: HS256 secrets and IdP public keys (RS256,
//! ES256, EdDSA, ...) each pinned to one algorithm, bound to tenants (a tenant's
//! tokens verify only against keys trusted for it) and to one kind of token (device
//! or service), optionally with the issuer and audience its tokens must name.
//!
//! # Layout
//! - `device`: a device token's claims ([`device_claims`]), and [`verify`] against one
//!   shared secret.
//! - `jwk`: one JSON Web Key made a [`TrustedKey`] (its algorithm pinned).
//! - `key_set`: the [`KeySet`] and the checks of a token against it.
//! - `trust_file`: the operator's trust file ([`TrustFile`]): which keys, files and
//!   JWKS URLs each tenant trusts.

mod device;
mod jwk;
mod key_set;
mod trust_file;

pub use device::{device_claims, verify, verify_at};
pub use jwk::{keys_of_jwks, JwkError, MAX_KEYS_PER_SET};
pub use key_set::{KeySet, Tenants, TokenKind, TrustedKey, Verified};
pub use trust_file::{Issuer, KeySource, TrustFile, TrustFileError};
