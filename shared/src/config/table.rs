//! The table of configuration keys: every key's dotted name, environment variable,
//! default, one-line meaning and the processes that read it.
//!
//! The loader accepts exactly the keys listed here (an unknown key is refused, or
//! ignored with a warning when it comes from the environment), and the documentation is
//! rendered from it ([`markdown_table`]). Each section declares its keys with
//! `section!`, which makes its struct, its defaults, its setter and its rows of the
//! table out of one list, so a key cannot be settable but undocumented, or documented
//! with a default it does not have.

use std::fmt::Write as _;
use std::net::SocketAddr;

use super::{Role, Secret, SetError};

/// Read by the gateway only.
pub(super) const GATEWAY: &[Role] = &[Role::Gateway];
/// Read by the worker only.
pub(super) const WORKER: &[Role] = &[Role::Worker];
/// Read by the gateway and the worker.
pub(super) const BOTH: &[Role] = &[Role::Gateway, Role::Worker];

/// One configuration key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// The dotted name (`outbox.max_attempts`), as in `--set` and the TOML file.
    pub name: &'static str,
    /// The default, as README.md and `--help` show it.
    pub default: DefaultText,
    /// The processes that read it.
    pub roles: &'static [Role],
    /// What it means, on one line.
    pub about: &'static str,
}

/// A key's default as documented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultText {
    /// The value itself, as the setter reads it (empty: unset).
    Value(&'static str),
    /// A default that is not one value (generated, or per process), described.
    Described(&'static str),
}

impl Key {
    pub(super) const fn new(
        name: &'static str,
        default: &'static str,
        roles: &'static [Role],
        about: &'static str,
    ) -> Key {
        Key { name, default: DefaultText::Value(default), roles, about }
    }

    pub(super) const fn described(
        name: &'static str,
        default: &'static str,
        roles: &'static [Role],
        about: &'static str,
    ) -> Key {
        Key { name, default: DefaultText::Described(default), roles, about }
    }

    /// The environment variable: `outbox.max_attempts` is `HERALD_OUTBOX__MAX_ATTEMPTS`.
    pub fn env(&self) -> String {
        env_name(self.name)
    }
}

/// A key accepted under an old name, applied to its replacement; the loader reports
/// each use in [`Cli::deprecated`](super::Cli::deprecated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    /// The old dotted name.
    pub name: &'static str,
    /// The key it sets.
    pub replacement: &'static str,
}

/// Old names still accepted.
pub const ALIASES: &[Alias] = &[
    // The gateway reads the cap too, so it left the worker's section.
    Alias { name: "worker.pending_cap", replacement: "delivery.pending_cap" },
];

/// The environment variable of a dotted key.
pub fn env_name(key: &str) -> String {
    format!("HERALD_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// The dotted key of a `HERALD_*` variable (`None` for other variables).
pub fn key_of_env(var: &str) -> Option<String> {
    var.strip_prefix("HERALD_").map(|rest| rest.to_ascii_lowercase().replace("__", "."))
}

/// Every key, section by section.
pub fn keys() -> impl Iterator<Item = &'static Key> {
    [
        super::ROOT_KEYS,
        super::AuthConfig::KEYS,
        super::RedisConfig::KEYS,
        super::IngressConfig::KEYS,
        super::GatewayConfig::KEYS,
        super::WorkerConfig::KEYS,
        super::DeliveryConfig::KEYS,
        super::OutboxConfig::KEYS,
        super::PushConfig::KEYS,
        super::OtelConfig::KEYS,
    ]
    .into_iter()
    .flatten()
}

/// What a dotted name refers to: a key, a deprecated name of one, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Key(&'static Key),
    Alias(&'static Alias),
    Unknown,
}

/// Looks a dotted name up in the key table, then among the deprecated names.
pub fn lookup(name: &str) -> Lookup {
    if let Some(k) = keys().find(|k| k.name == name) {
        Lookup::Key(k)
    } else if let Some(a) = ALIASES.iter().find(|a| a.name == name) {
        Lookup::Alias(a)
    } else {
        Lookup::Unknown
    }
}

/// The configuration table of README.md: every key, then the deprecated aliases.
pub fn markdown_table() -> String {
    let roles = |roles: &[Role]| roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ");
    let mut out = String::from("| variable | key | default | used by | meaning |\n|---|---|---|---|---|\n");
    let mut row = |cells: [&str; 5]| {
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    };
    for k in keys() {
        let default = match k.default {
            DefaultText::Value("") => String::new(),
            DefaultText::Value(v) => format!("`{v}`"),
            DefaultText::Described(d) => d.to_string(),
        };
        row([&format!("`{}`", k.env()), &format!("`{}`", k.name), &default, &roles(k.roles), k.about]);
    }
    for a in ALIASES {
        let used_by = match lookup(a.replacement) {
            Lookup::Key(k) => roles(k.roles),
            _ => String::new(),
        };
        let about = format!("Deprecated name of `{}`; applied to it, with a warning.", a.replacement);
        row([&format!("`{}`", env_name(a.name)), &format!("`{}`", a.name), "", &used_by, &about]);
    }
    out
}

/// A value type a key can have, read from its text form (the same in the TOML file,
/// the environment and flags).
pub(super) trait Setting: Sized {
    fn parse(v: &str) -> Result<Self, String>;
}

macro_rules! whole_numbers {
    ($($t:ty),*) => {$(
        impl Setting for $t {
            fn parse(v: &str) -> Result<Self, String> {
                v.trim().parse().map_err(|_| format!("expected a non-negative whole number, got {v:?}"))
            }
        }
    )*};
}
whole_numbers!(u32, u64, usize);

impl Setting for f64 {
    fn parse(v: &str) -> Result<Self, String> {
        match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() => Ok(n),
            _ => Err(format!("expected a number, got {v:?}")),
        }
    }
}

impl Setting for bool {
    fn parse(v: &str) -> Result<Self, String> {
        match v.trim() {
            "true" | "1" | "yes" => Ok(true),
            "false" | "0" | "no" => Ok(false),
            _ => Err(format!("expected true or false, got {v:?}")),
        }
    }
}

impl Setting for String {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(v.into())
    }
}

impl Setting for Secret {
    fn parse(v: &str) -> Result<Self, String> {
        Ok(Secret(v.into()))
    }
}

impl Setting for SocketAddr {
    fn parse(v: &str) -> Result<Self, String> {
        v.parse().map_err(|_| format!("expected host:port, got {v:?}"))
    }
}

impl Setting for crate::telemetry::LogFormat {
    fn parse(v: &str) -> Result<Self, String> {
        v.parse()
    }
}

/// A comma-separated list (a TOML array is flattened to one).
impl Setting for Vec<u64> {
    fn parse(v: &str) -> Result<Self, String> {
        v.split(',').map(u64::parse).collect()
    }
}

/// Parses a value for a setter; its errors are [`SetError::Invalid`].
pub(super) fn parse<T: Setting>(v: &str) -> Result<T, SetError> {
    T::parse(v).map_err(SetError::Invalid)
}

/// Declares a section: its struct (fields documented, the first line of each field's
/// documentation being its one-line meaning in the key table), its documented defaults
/// (`Default`), its setter and its keys. Validation stays hand-written beside it.
macro_rules! section {
    (
        $(#[doc = $doc:literal])*
        pub struct $ty:ident in $section:literal, read by $roles:expr;
        {
            $(
                #[doc = $about:literal]
                $(#[doc = $more:literal])*
                pub $field:ident: $fty:ty = $default:literal,
            )*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Clone, Debug)]
        pub struct $ty {
            $(
                #[doc = $about]
                $(#[doc = $more])*
                pub $field: $fty,
            )*
        }

        impl $ty {
            /// This section's rows of the key table.
            pub const KEYS: &'static [$crate::config::Key] = &[$(
                $crate::config::Key::new(
                    concat!($section, ".", stringify!($field)),
                    $default,
                    $roles,
                    $about.trim_ascii(),
                ),
            )*];

            /// Applies one key of this section, named without the section.
            pub fn set(&mut self, name: &str, v: &str) -> Result<(), $crate::config::SetError> {
                match name {
                    $(stringify!($field) => self.$field = $crate::config::table::parse(v)?,)*
                    _ => return Err($crate::config::SetError::UnknownKey),
                }
                Ok(())
            }
        }

        impl Default for $ty {
            /// The documented defaults: the `default` column of the key table.
            fn default() -> Self {
                $ty {
                    $($field: $crate::config::table::parse($default).expect(concat!(
                        "the documented default of ", $section, ".", stringify!($field), " parses"
                    )),)*
                }
            }
        }
    };
}
pub(super) use section;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::Config;
    use super::*;

    #[test]
    fn every_documented_default_is_the_default_and_settable() {
        for k in keys() {
            let DefaultText::Value(text) = k.default else { continue };
            for &role in k.roles {
                let mut cfg = Config::defaults(role);
                let before = format!("{cfg:?}");
                cfg.set(k.name, text).unwrap_or_else(|e| panic!("{}: the documented default {text:?}: {e}", k.name));
                assert_eq!(format!("{cfg:?}"), before, "{} is documented as {text:?} for the {role:?}", k.name);
            }
        }
    }

    #[test]
    fn described_defaults_name_the_real_ones() {
        let admin = keys().find(|k| k.name == "admin_listen").unwrap();
        let DefaultText::Described(text) = admin.default else { panic!("admin_listen differs per process") };
        for role in [Role::Gateway, Role::Worker] {
            let addr = Config::defaults(role).admin_listen.to_string();
            assert!(text.contains(&format!("{} `{addr}`", role.name())), "{text} lacks {role:?} {addr}");
        }
    }

    #[test]
    fn keys_are_unique_one_line_and_map_to_their_variable() {
        let mut seen = HashSet::new();
        for k in keys() {
            assert!(seen.insert(k.name), "{} twice", k.name);
            assert!(!k.roles.is_empty(), "{} is read by nobody", k.name);
            assert!(!k.about.contains(['\n', '|']), "{}: one line, no table bars: {:?}", k.name, k.about);
            let sentence = k.about.starts_with(|c: char| c.is_uppercase()) && k.about.ends_with('.');
            assert!(sentence, "{}: a sentence, as the others: {:?}", k.name, k.about);
            assert_eq!(key_of_env(&k.env()).as_deref(), Some(k.name));
            assert_eq!(lookup(k.name), Lookup::Key(k));
        }
        assert_eq!(env_name("outbox.max_attempts"), "HERALD_OUTBOX__MAX_ATTEMPTS");
        assert_eq!(lookup("outbox.bogus"), Lookup::Unknown);
    }

    #[test]
    fn aliases_name_keys_that_exist_and_are_not_keys_themselves() {
        for a in ALIASES {
            assert!(matches!(lookup(a.replacement), Lookup::Key(_)), "{} -> {}", a.name, a.replacement);
            assert_eq!(lookup(a.name), Lookup::Alias(a));
        }
    }
}
