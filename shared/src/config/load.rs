//! Loading: defaults, then the TOML file, the environment and the flags, each layer
//! applied key by key through the key table.

use std::collections::BTreeMap;
use std::path::Path;

use super::cli::{self, Cli, Deprecated};
use super::environment;
use super::table::key_of_env;
use super::{env_name, lookup, Config, ConfigError, ConfigErrors, Lookup, Role, SetError};

/// Where environment variables come from; tests pass a map instead of mutating the
/// process environment.
pub trait Env {
    fn vars(&self) -> Vec<(String, String)>;
}

#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars().collect()
    }
}

impl Env for BTreeMap<String, String> {
    fn vars(&self) -> Vec<(String, String)> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// Where a value came from, as problems name it.
#[derive(Clone, Copy)]
enum Origin<'a> {
    File(&'a Path),
    /// The variable's name.
    Env(&'a str),
    Flag,
}

impl Origin<'_> {
    fn label(self, key: &str) -> String {
        match self {
            Origin::File(path) => format!("{key} (in {})", path.display()),
            Origin::Env(var) => format!("{key} ({var})"),
            Origin::Flag => format!("{key} (flag)"),
        }
    }
}

/// Loads the configuration from every layer. `argv` excludes the program name.
pub fn load(role: Role, argv: &[String], env: &dyn Env) -> Result<(Config, Cli), ConfigErrors> {
    let mut cfg = Config::defaults(role);
    let parsed = cli::parse(argv);
    let mut errors = parsed.errors;
    let mut cli = Cli { args: parsed.args, ..Cli::default() };
    let mut file = parsed.file;

    let mut env_sets = Vec::new();
    for (var, v) in env.vars() {
        if var == "HERALD_CONFIG" {
            file = file.or(Some(v.into()));
        } else if let Some(key) = key_of_env(&var) {
            env_sets.push((var, key, v));
        }
    }

    // Within a layer, deprecated names go first, so a new name given beside its old
    // one wins however the layer is ordered (the process environment has no order).
    let old_first = |key: &str| !matches!(lookup(key), Lookup::Alias(_));
    if let Some(path) = &file {
        let mut sets = read_file(path, &mut errors);
        sets.sort_by_key(|(k, _)| old_first(k));
        for (k, v) in sets {
            apply(&mut cfg, &mut errors, &mut cli, Origin::File(path), &k, &v);
        }
    }
    env_sets.sort_by_key(|(_, k, _)| old_first(k));
    for (var, key, v) in &env_sets {
        apply(&mut cfg, &mut errors, &mut cli, Origin::Env(var), key, v);
    }
    let mut flag_sets = parsed.sets;
    flag_sets.sort_by_key(|(k, _)| old_first(k));
    for (k, v) in &flag_sets {
        apply(&mut cfg, &mut errors, &mut cli, Origin::Flag, k, v);
    }
    cfg.validate(role, &mut errors);
    if errors.is_empty() {
        Ok((cfg, cli))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Applies one value; a deprecated name sets its replacement and is noted. An unknown
/// key is an error wherever it comes from (with the nearest key as a hint), except the
/// `HERALD_*` variables an orchestrator sets itself (Kubernetes service links), which
/// are only noted.
fn apply(cfg: &mut Config, errors: &mut Vec<ConfigError>, cli: &mut Cli, origin: Origin, key: &str, v: &str) {
    let target = match lookup(key) {
        Lookup::Alias(alias) => {
            cli.deprecated.push(Deprecated { given: origin.label(key), replacement: alias.replacement });
            alias.replacement
        }
        _ => key,
    };
    match (cfg.set(target, v), origin) {
        (Ok(()), _) => {}
        (Err(SetError::UnknownKey), Origin::Env(var)) if environment::tolerated(var, v) => {
            cli.ignored_env.push(var.into())
        }
        (Err(SetError::UnknownKey), _) => {
            let message = match environment::nearest_key(key) {
                Some(near) => format!("unknown key; did you mean {near} ({})?", env_name(near)),
                None => "unknown key".to_string(),
            };
            errors.push(ConfigError { key: origin.label(key), message })
        }
        (Err(e), _) => errors.push(ConfigError { key: origin.label(key), message: e.to_string() }),
    }
}

/// The file's keys, flattened to dotted names.
fn read_file(path: &Path, errors: &mut Vec<ConfigError>) -> Vec<(String, String)> {
    let mut problem = |message: String| errors.push(ConfigError { key: path.display().to_string(), message });
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            problem(format!("cannot read: {e}"));
            return Vec::new();
        }
    };
    match text.parse::<toml::Table>() {
        Ok(table) => {
            let mut flat = Vec::new();
            flatten("", &toml::Value::Table(table), &mut flat);
            flat
        }
        Err(e) => {
            problem(format!("not valid TOML: {e}"));
            Vec::new()
        }
    }
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => out.push((prefix.into(), s.clone())),
        toml::Value::Array(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|i| match i {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            out.push((prefix.into(), parts.join(",")));
        }
        other => out.push((prefix.into(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{argv, env, SECRET};
    use super::*;

    #[test]
    fn layers_apply_in_order_file_env_flags() {
        let dir = std::env::temp_dir().join(format!("herald-cfg-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("h.toml");
        std::fs::write(
            &file,
            "node_id = \"from-file\"\n[outbox]\nmax_attempts = 7\nbackoff_ms = [1, 2]\n[worker]\nbatch_max = 9\n",
        )
        .unwrap();
        let e = env(&[SECRET, ("HERALD_OUTBOX__MAX_ATTEMPTS", "3"), ("HERALD_NODE_ID", "from-env"), ("PATH", "/x")]);
        let argv = argv(&["--config", file.to_str().unwrap(), "--node-id", "from-flag", "migrate"]);
        let (cfg, cli) = load(Role::Worker, &argv, &e).unwrap();
        assert_eq!(cfg.node_id, "from-flag");
        assert_eq!(cfg.outbox.max_attempts, 3);
        assert_eq!(cfg.outbox.backoff_ms, vec![1, 2]);
        assert_eq!(cfg.worker.batch_max, 9);
        assert_eq!(cli.args, vec!["migrate".to_string()]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_bad_key_is_reported_at_once() {
        let e = env(&[("HERALD_LISTEN", "nope"), ("HERALD_OUTBOX__MAX_ATTEMPTS", "-1")]);
        let argv = argv(&["--wat", "--set", "worker.bogus=1"]);
        let err = load(Role::Gateway, &argv, &e).unwrap_err();
        let text = err.to_string();
        for key in ["listen (HERALD_LISTEN)", "outbox.max_attempts", "worker.bogus (flag)", "--wat", "jwt_secret"] {
            assert!(text.contains(key), "{key} missing from:\n{text}");
        }
    }

    #[test]
    fn kubernetes_service_links_are_reported_not_fatal() {
        let e = env(&[SECRET, ("HERALD_SERVICE_HOST", "10.0.0.1"), ("HERALD_GATEWAY_PORT", "tcp://10.0.0.1:8080")]);
        let (_, cli) = load(Role::Gateway, &[], &e).unwrap();
        assert_eq!(cli.ignored_env, ["HERALD_GATEWAY_PORT", "HERALD_SERVICE_HOST"]);
    }

    /// A typo in a variable's name used to be a warning, and the default ran instead.
    #[test]
    fn an_unknown_environment_variable_is_refused_with_the_nearest_key() {
        let e = env(&[SECRET, ("HERALD_GATEWAY__HEARTBEAT", "1000"), ("HERALD_SOMETHING_ELSE", "1")]);
        let err = load(Role::Worker, &[], &e).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.0.len(), 2, "{text}");
        assert!(
            text.contains("gateway.heartbeat (HERALD_GATEWAY__HEARTBEAT): unknown key; did you mean gateway.heartbeat_ms (HERALD_GATEWAY__HEARTBEAT_MS)?"),
            "{text}"
        );
        assert!(text.contains("something_else (HERALD_SOMETHING_ELSE): unknown key\n"), "{text}");
    }

    #[test]
    fn an_unknown_key_in_the_file_is_refused_with_the_file_named() {
        let dir = std::env::temp_dir().join(format!("herald-cfg-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("h.toml");
        std::fs::write(&file, "[gateway]\nsend_timeout = 5\n").unwrap();
        let err = load(Role::Gateway, &argv(&["--config", file.to_str().unwrap()]), &env(&[SECRET])).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert!(err.0[0].key.starts_with("gateway.send_timeout (in "), "{err}");
        assert_eq!(
            err.0[0].message,
            "unknown key; did you mean gateway.send_timeout_ms (HERALD_GATEWAY__SEND_TIMEOUT_MS)?"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_setter_tells_unknown_keys_from_bad_values() {
        let mut cfg = Config::defaults(Role::Worker);
        assert_eq!(cfg.set("outbox.max_attempts", "4"), Ok(()));
        assert_eq!(cfg.set("outbox.nope", "4"), Err(SetError::UnknownKey));
        assert_eq!(cfg.set("nope.max_attempts", "4"), Err(SetError::UnknownKey));
        assert!(matches!(cfg.set("outbox.max_attempts", "four"), Err(SetError::Invalid(m)) if m.contains("\"four\"")));
        assert!(matches!(cfg.set("listen", "nowhere"), Err(SetError::Invalid(m)) if m.contains("host:port")));
    }

    /// The service secret is optional, but when set it is long enough and not the
    /// devices' secret (whoever holds that would mint service tokens).
    #[test]
    fn a_service_secret_is_long_and_apart_from_the_jwt_secret() {
        let service = |v: &'static str| env(&[SECRET, ("HERALD_SERVICE_SECRET", v)]);
        assert!(load(Role::Gateway, &[], &env(&[SECRET])).is_ok(), "unset: the server API is off");
        assert!(load(Role::Gateway, &[], &service("another-secret-of-24-bytes")).is_ok());
        for bad in ["short", SECRET.1] {
            let err = load(Role::Gateway, &[], &service(bad)).unwrap_err();
            assert!(err.0.iter().any(|e| e.key.starts_with("service_secret")), "{bad}: {err}");
        }
    }

    #[test]
    fn secrets_are_not_printed() {
        let e = env(&[("HERALD_JWT_SECRET", "supersecretsupersecret")]);
        let (cfg, _) = load(Role::Gateway, &[], &e).unwrap();
        assert!(!format!("{cfg:?}").contains("supersecret"));
    }
}
