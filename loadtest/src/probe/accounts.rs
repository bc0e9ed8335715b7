//! The probe's two accounts and their tokens: given as tokens (`--token-a`,
//! `--token-b`, or `PROBE_TOKEN_A`, `PROBE_TOKEN_B`), a credential that acts only as
//! these two probe accounts of the probe tenant; or minted from the shared secret
//! (`--secret`, `HERALD_JWT_SECRET`), which signs for every tenant.

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use herald_client::token;
use herald_shared::auth::{Claims, Platform};

use crate::cli;

/// One probe account: its token and the claims read from it.
#[derive(Clone, Debug)]
pub struct Account {
    pub token: String,
    pub sub: String,
    pub tid: String,
}

#[derive(Clone, Debug)]
pub struct Accounts {
    pub a: Account,
    pub b: Account,
}

/// The accounts the probe runs as.
pub fn accounts(args: &cli::Probe) -> Result<Accounts> {
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let given = (
        args.token_a.clone().or_else(|| from_env("PROBE_TOKEN_A")),
        args.token_b.clone().or_else(|| from_env("PROBE_TOKEN_B")),
    );
    match given {
        (Some(a), Some(b)) => {
            let (a, b) = (account(a).context("--token-a")?, account(b).context("--token-b")?);
            if a.tid != b.tid || a.sub == b.sub {
                bail!("--token-a and --token-b must be two users of one tenant");
            }
            Ok(Accounts { a, b })
        }
        (None, None) => {
            let secret = args.secret.get()?;
            let minted = |user: String| Account {
                token: token(&secret, &args.tenant, &user, "probe", Platform::Probe),
                sub: user,
                tid: args.tenant.clone(),
            };
            Ok(Accounts { a: minted(format!("{}-a", args.name)), b: minted(format!("{}-b", args.name)) })
        }
        _ => bail!("give both probe tokens (--token-a and --token-b), or neither"),
    }
}

/// The tenant and user of a token, read without checking it (the gateway does).
fn account(token: String) -> Result<Account> {
    let payload = token.split('.').nth(1).context("not a JWT")?;
    let claims: Claims = URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .context("the token's claims do not read (tid, sub, dev, plat, exp)")?;
    Ok(Account { token, sub: claims.sub, tid: claims.tid })
}
