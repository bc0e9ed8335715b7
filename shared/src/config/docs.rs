//! Keeps the documentation in step with the key table: README.md's configuration table
//! is the rendered table, and every `HERALD_*` setting the Helm chart names is a key.
//!
//! Regenerate README.md's table after changing a key:
//! `UPDATE_README=1 cargo test -p herald-shared --lib config::docs`.

use std::path::{Path, PathBuf};

use super::table::key_of_env;
use super::{lookup, markdown_table, Lookup};

const REGENERATE: &str = "UPDATE_README=1 cargo test -p herald-shared --lib config::docs";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The line range of the first table under `## Configuration`.
fn config_table(readme: &str) -> std::ops::Range<usize> {
    let lines: Vec<&str> = readme.lines().collect();
    let section =
        lines.iter().position(|l| l.trim_end() == "## Configuration").expect("README.md has ## Configuration");
    let end_of_section =
        lines[section + 1..].iter().position(|l| l.starts_with("## ")).map_or(lines.len(), |i| section + 1 + i);
    let start = (section..end_of_section)
        .find(|&i| lines[i].starts_with('|'))
        .expect("README.md's ## Configuration has a table");
    let end = (start..end_of_section).find(|&i| !lines[i].starts_with('|')).unwrap_or(end_of_section);
    start..end
}

/// A line diff (longest common subsequence): `-` only in `old`, `+` only in `new`.
fn diff(old: &[&str], new: &[&str]) -> String {
    let (n, m) = (old.len(), new.len());
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old[i] == new[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out += &format!("- {}\n", old[i]);
            i += 1;
        } else {
            out += &format!("+ {}\n", new[j]);
            j += 1;
        }
    }
    out
}

#[test]
fn readme_configuration_table_is_the_key_table() {
    let path = repo().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("README.md");
    let range = config_table(&readme);
    let lines: Vec<&str> = readme.lines().collect();
    let expected = markdown_table();
    let expected: Vec<&str> = expected.lines().collect();
    if lines[range.clone()] == expected[..] {
        return;
    }
    if std::env::var_os("UPDATE_README").is_some() {
        let mut out: Vec<&str> = lines[..range.start].to_vec();
        out.extend(&expected);
        out.extend(&lines[range.end..]);
        let trailing = if readme.ends_with('\n') { "\n" } else { "" };
        std::fs::write(&path, out.join("\n") + trailing).expect("write README.md");
        return;
    }
    panic!(
        "README.md's configuration table differs from the key table (- README.md, + key table):\n{}\n\
         Regenerate it with: {REGENERATE}",
        diff(&lines[range], &expected)
    );
}

/// Words of `text` made of `A-Z`, `0-9` and `_`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).filter(|w| !w.is_empty())
}

/// The keys of the top-level `config:` map of a values file (`HERALD_*` without the prefix).
fn config_entries(values: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in values.lines() {
        if line.starts_with("config:") {
            inside = true;
        } else if inside && line.starts_with("  ") {
            if let Some((name, _)) = line.trim().split_once(':') {
                if !name.starts_with('#') {
                    out.push(format!("HERALD_{}", name.trim().trim_matches('"')));
                }
            }
        } else if !line.trim().is_empty() && !line.starts_with('#') {
            inside = false;
        }
    }
    out
}

/// Every setting the chart names, with the file naming it: `HERALD_*` variables in
/// templates, values, schema, CI values and the chart's README, the entries of `config:`
/// maps, and the prefix-less `SECTION__KEY` examples of the comments.
fn chart_settings() -> Vec<(String, String)> {
    let chart = repo().join("helm/herald");
    let mut files: Vec<PathBuf> =
        ["values.yaml", "values.schema.json", "README.md"].iter().map(|f| chart.join(f)).collect();
    for dir in ["templates", "ci"] {
        for entry in std::fs::read_dir(chart.join(dir)).expect("chart directory") {
            files.push(entry.expect("chart file").path());
        }
    }
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.strip_prefix(&chart).unwrap_or(&file).display().to_string();
        for w in words(&text) {
            // `HERALD_` alone is a template (`HERALD_{{ $key }}`).
            if w.starts_with("HERALD_") && w.len() > "HERALD_".len() {
                found.push((name.clone(), w.to_string()));
            } else if !w.starts_with("HERALD_") && w.contains("__") && !w.starts_with('_') {
                found.push((name.clone(), format!("HERALD_{w}")));
            }
        }
        if file.extension().is_some_and(|e| e == "yaml") {
            found.extend(config_entries(&text).into_iter().map(|v| (name.clone(), v)));
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn every_setting_the_chart_names_is_a_key() {
    let found = chart_settings();
    let names: Vec<&str> = found.iter().map(|(_, v)| v.as_str()).collect();
    for expected in ["HERALD_JWT_SECRET", "HERALD_INGRESS__SHARDS", "HERALD_GATEWAY__HEARTBEAT_MS", "HERALD_LOG"] {
        assert!(names.contains(&expected), "the chart scan missed {expected}: {names:?}");
    }
    let unknown: Vec<String> = found
        .iter()
        .filter(|(_, var)| var != "HERALD_CONFIG")
        .filter(|(_, var)| !matches!(key_of_env(var).as_deref().map(lookup), Some(Lookup::Key(_))))
        .map(|(file, var)| format!("{file}: {var}"))
        .collect();
    assert!(
        unknown.is_empty(),
        "the Helm chart names settings that are not keys (or deprecated names):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_diff_shows_what_changed() {
    assert_eq!(diff(&["a", "b", "c"], &["a", "x", "c"]), "- b\n+ x\n");
    assert_eq!(diff(&["a"], &["a", "b"]), "+ b\n");
    assert_eq!(config_entries("config:\n  LOG: \"x\"\n  # c\ngateway:\n  A__B: 1\n"), ["HERALD_LOG"]);
}
