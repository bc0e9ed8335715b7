//! `--help` on every binary: usage on stdout and exit status 0, with no configuration
//! and no environment at all (no JWT secret, no database).

use herald_tests::bin;

fn help(name: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(bin(name)).args(args).env_clear().output().expect("the binary runs");
    assert!(out.status.success(), "{name} {args:?}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

#[test]
fn the_gateway_and_the_worker_print_their_help() {
    let text = help("herald-gateway", &["--help"]);
    for expected in ["Usage: herald-gateway", "--config FILE", "--set KEY=VALUE", "gateway.send_timeout_ms"] {
        assert!(text.contains(expected), "{expected:?} missing from:\n{text}");
    }
    for args in [&["--help"][..], &["-h"], &["help"], &["rebuild-projections", "--help"]] {
        let text = help("herald-worker", args);
        for expected in
            ["Usage: herald-worker [COMMAND]", "migrate", "rebuild-projections [--dry-run]", "--admin-listen"]
        {
            assert!(text.contains(expected), "{args:?}: {expected:?} missing from:\n{text}");
        }
    }
}

#[test]
fn the_load_test_prints_its_help_and_each_command_s() {
    let text = help("herald-loadtest", &["--help"]);
    for cmd in ["steady", "fanout", "storm", "chaos", "idle", "sends", "probe", "report", "token", "service-token"] {
        assert!(text.contains(cmd), "{cmd} missing from:\n{text}");
    }
    let text = help("herald-loadtest", &["chaos", "--help"]);
    for option in ["--action <SECONDS=COMMAND>", "--rate", "--gateways", "--secret"] {
        assert!(text.contains(option), "{option} missing from:\n{text}");
    }
}
