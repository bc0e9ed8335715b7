//! The command lines the scripts, the chart and the tests use still parse.

use clap::CommandFactory;

use super::*;

fn parse(words: &[&str]) -> Result<Command, clap::Error> {
    Cli::try_parse_from(std::iter::once("herald-loadtest").chain(words.iter().copied())).map(|c| c.command)
}

#[test]
fn the_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn actions_repeat_other_options_take_their_last_value() {
    let Command::Chaos(c) =
        parse(&["chaos", "--action", "1=a", "--action", "2=b c", "--rate", "5", "--rate", "7"]).unwrap()
    else {
        panic!("chaos")
    };
    let actions: Vec<(f64, &str)> = c.action.iter().map(|a| (a.at, a.command.as_str())).collect();
    assert_eq!(actions, [(1.0, "a"), (2.0, "b c")]);
    assert_eq!((c.traffic.rate, c.conversations), (7.0, 300));
    let Command::Steady(s) = parse(&["steady", "--gateways", "http://a,http://b", "--gateways", "http://c"]).unwrap()
    else {
        panic!("steady")
    };
    assert_eq!(s.target.gateways.urls, ["http://c"]);
    let Command::Fanout(f) = parse(&["fanout", "--action", "10=scripts/profile.sh gateway"]).unwrap() else {
        panic!("fanout")
    };
    assert_eq!(
        f.action.iter().map(|a| (a.at, a.command.as_str())).collect::<Vec<_>>(),
        [(10.0, "scripts/profile.sh gateway")]
    );
    let Command::Steady(s) = parse(&["steady"]).unwrap() else { panic!("steady") };
    assert!(s.action.is_empty(), "steady needs no action");
}

#[test]
fn typos_missing_values_and_bad_numbers_are_refused() {
    for words in [
        &["steady", "--rat", "5"][..],
        &["steady", "--rate"],
        &["steady", "--conversations", "-1"],
        &["chaos", "--rate", "5"],
        &["chaos", "--action", "soon=x"],
        &["idle"],
        &["storm", "--fresh", "maybe"],
        &["storm", "--warm-up", "soon"],
        &["failover", "--devices", "10"],
        &["token", "--user", "u"],
        &["report"],
        &["probe", "--interval-ms", "0"],
        &["nope"],
    ] {
        assert!(parse(words).is_err(), "{words:?} was accepted");
    }
}

#[test]
fn defaults_are_the_documented_ones() {
    let Command::Storm(s) = parse(&["storm"]).unwrap() else { panic!("storm") };
    assert_eq!(
        (s.devices, s.backlog, s.group, s.realtime, s.rate, s.warm_up, s.baseline, s.fresh),
        (5000, 200, 50, 100, 200.0, 1.0, 5.0, false)
    );
    assert_eq!(s.target.gateways.urls, ["http://127.0.0.1:8080"]);
    assert_eq!((s.target.tenant.as_str(), s.target.out.to_str()), ("bench", Some("loadtest-reports")));
    let Command::Probe(p) = parse(&["probe"]).unwrap() else { panic!("probe") };
    assert_eq!((p.tenant.as_str(), p.name.as_str(), p.interval_ms, p.loss_after_ms), ("probe", "canary", 1000, 30_000));
    assert_eq!((p.listen.to_string(), p.duration), ("127.0.0.1:9099".to_string(), 0));
    let Command::Report(r) = parse(&["report", "--dir", "d"]).unwrap() else { panic!("report") };
    assert_eq!((r.out.to_str(), r.machine.as_str()), (Some("docs/capacity-report.md"), "not recorded"));
}

#[test]
fn soak_defaults_admin_urls_and_exemptions() {
    let Command::Soak(s) = parse(&["soak", "--duration", "100"]).unwrap() else { panic!("soak") };
    assert_eq!((s.conversations, s.rate, s.churn_every, s.sample_every, s.warmup_s()), (300, 300.0, 10.0, 5.0, 20.0));
    assert_eq!((s.leave_pct, s.join_pct, s.reconnect_pct, s.max_growth), (2.0, 2.0, 5.0, 0.10));
    assert_eq!(s.exempt, ["rows.messages"]);
    assert_eq!(s.redis_prefix, "hd");
    assert!(s.admins().is_empty());
    assert_eq!(s.redis_url(), "redis://127.0.0.1:6379/0");
    let Command::Soak(s) = parse(&[
        "soak",
        "--admin",
        "wk-1=http://127.0.0.1:9191/",
        "--admin",
        "http://127.0.0.1:9190",
        "--exempt",
        "none",
        "--warmup",
        "3",
    ])
    .unwrap() else {
        panic!("soak")
    };
    let admins: Vec<(&str, &str)> = s.admins().iter().map(|a| (a.name.as_str(), a.url.as_str())).collect();
    assert_eq!(admins, [("wk-1", "http://127.0.0.1:9191"), ("127.0.0.1:9190", "http://127.0.0.1:9190")]);
    assert_eq!((s.exempt.as_slice(), s.warmup_s()), (&["none".to_string()][..], 3.0));
    assert!(parse(&["soak", "--admin", "127.0.0.1:9190"]).is_err(), "an admin URL has a scheme");
    assert!(parse(&["soak", "--admin", "x=http://h:1/metrics"]).is_err(), "the listener, not a path");
}

/// The command lines of scripts/capacity.sh, scripts/run.sh, the Helm chart's probe
/// and tests/tests/{loadtest,loadtest_failover,probe}.rs.
#[test]
fn the_callers_command_lines_parse() {
    let tail = ["--gateways", "http://127.0.0.1:8180,http://127.0.0.1:8181", "--out", "docs/capacity"];
    for line in [
        "steady --conversations 200 --rate 5000 --duration 30",
        "fanout --receivers 4000 --group 200 --rate 0 --duration 30",
        "storm --devices 5000 --backlog 200 --group 50 --realtime 100 --rate 200 --baseline 5",
        "idle --connections 18000 --hold 10 --connect-rate 3000 --gateway-pid 42",
        "chaos --conversations 300 --rate 1000 --duration 40 --action 4=x --action 8=y",
        "failover --devices 10000 --group 50 --rate 20 --baseline 5 --kill x",
        "failover --devices 50 --group 10 --rate 20 --baseline 2 --after 1 --kill x --tenant lt",
        "steady --conversations 20 --rate 200 --duration 3 --tenant lt",
        "storm --devices 60 --backlog 20 --group 30 --realtime 4 --rate 20 --baseline 1 --fresh true",
        "idle --connections 150 --group 50 --hold 1 --gateway-pid 7 --local-ips 127.0.0.1,127.0.0.2",
        "soak --conversations 300 --rate 300 --duration 600 --admin gw-1=http://127.0.0.1:9190 --admin http://127.0.0.1:9191 --mysql-url mysql://root@127.0.0.1:3306/herald_capacity --redis-prefix cap",
        "soak --conversations 300 --rate 300 --duration 600 --redis-prefix cap --mysql-url mysql://root@127.0.0.1:3306/herald_capacity --admin wk-1=http://127.0.0.1:9191 --admin gw-1=http://127.0.0.1:9190 --admin gw-2=http://127.0.0.1:9192 --redis-url redis://127.0.0.1:6379/0",
        "idle --connections 18000 --hold 10 --connect-rate 3000 --gateway-pid 42 --admin wk-1=http://127.0.0.1:9191 --redis-url redis://127.0.0.1:6379/0",
    ] {
        let words: Vec<&str> = line.split(' ').chain(tail).collect();
        parse(&words).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    for line in [
        "report --dir docs/capacity --out docs/capacity-report.md --machine 2-cores",
        "token --secret s --tenant acme --user alice --device phone",
        "token --secret s --tenant probe --user canary-a --device probe --platform probe --ttl-s 31536000 --kid probe-1",
        "probe --gateways http://gw:80 --tenant probe --name herald --interval-ms 1000 --loss-after-ms 30000 --listen 0.0.0.0:9099",
        "probe --gateways http://a,http://b --interval-ms 100 --duration 30 --listen 127.0.0.1:1",
        "probe --gateways http://gw:80 --tenant probe --name t --interval-ms 200 --loss-after-ms 5000 --duration 20 --fail-on-loss --listen 127.0.0.1:9099",
        "sends --gateways http://a,http://b --conversations 10 --senders 10 --duration 1 --json x.json",
    ] {
        parse(&line.split(' ').collect::<Vec<_>>()).unwrap_or_else(|e| panic!("{line}: {e}"));
    }
}

#[test]
fn senders_send_over_http_or_ws_with_some_in_flight() {
    let Command::Steady(s) = parse(&["steady"]).unwrap() else { panic!("steady") };
    assert_eq!((s.traffic.via, s.traffic.in_flight), (crate::cli::SendVia::Http, 1));
    let Command::Fanout(f) = parse(&["fanout", "--via", "ws", "--in-flight", "8"]).unwrap() else { panic!("fanout") };
    assert_eq!((f.traffic.via, f.traffic.in_flight), (crate::cli::SendVia::Ws, 8));
    for words in [&["steady", "--via", "smoke"][..], &["steady", "--in-flight", "0"], &["chaos", "--via"]] {
        assert!(parse(words).is_err(), "{words:?} was accepted");
    }
}

#[test]
fn senders_change_their_messages_only_when_asked() {
    let Command::Steady(s) = parse(&["steady"]).unwrap() else { panic!("steady") };
    assert_eq!(s.traffic.change_every, 0, "no timeline changes by default");
    let Command::Chaos(c) = parse(&["chaos", "--action", "1=true", "--change-every", "10"]).unwrap() else {
        panic!("chaos")
    };
    assert_eq!(c.traffic.change_every, 10);
    assert!(parse(&["steady", "--change-every", "-1"]).is_err());
}

#[test]
fn every_scenario_takes_the_processes_to_measure() {
    for scenario in ["steady", "fanout", "storm", "chaos", "idle", "soak", "typing"] {
        let words =
            [scenario, "--admin", "gw-1=http://127.0.0.1:9190", "--admin", "http://h:1", "--redis-url", "redis://r:1"];
        let target = match parse(&words) {
            Ok(Command::Steady(a)) => a.target,
            Ok(Command::Fanout(a)) => a.target,
            Ok(Command::Storm(a)) => a.target,
            Ok(Command::Chaos(a)) => a.target,
            Ok(Command::Idle(a)) => a.target,
            Ok(Command::Soak(a)) => a.target,
            Ok(Command::Typing(a)) => a.target,
            // chaos needs an action, idle a pid: the options themselves parsed
            Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => continue,
            other => panic!("{scenario}: {other:?}"),
        };
        let names: Vec<&str> = target.measure.admins.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["gw-1", "h:1"], "{scenario}");
        assert_eq!(target.measure.redis_url.as_deref(), Some("redis://r:1"), "{scenario}");
    }
    let Command::Steady(s) = parse(&["steady"]).unwrap() else { panic!("steady") };
    assert!(s.target.measure.admins.is_empty() && s.target.measure.redis_url.is_none());
}

#[test]
fn help_lists_every_command_and_a_command_s_options() {
    let help = Cli::command().render_long_help().to_string();
    for cmd in ["steady", "fanout", "storm", "chaos", "idle", "soak", "typing", "sends", "probe", "report", "token"] {
        assert!(help.contains(cmd), "{cmd} missing from:\n{help}");
    }
    let mut cli = Cli::command();
    let storm = cli.find_subcommand_mut("storm").unwrap().render_long_help().to_string();
    for option in ["--devices", "--backlog", "--fresh", "--gateways", "--secret", "--local-ips", "[default: 5000]"] {
        assert!(storm.contains(option), "{option} missing from:\n{storm}");
    }
    let Err(e) = parse(&["--help"]) else { panic!("--help is not a command") };
    assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
}

#[test]
fn a_ca_file_is_taken_wherever_gateways_are_and_must_exist() {
    for words in [
        &["steady", "--gateways", "https://gw:443", "--ca-file", "ca.pem"][..],
        &["probe", "--gateways", "https://gw:443", "--ca-file", "ca.pem"],
        &["sends", "--gateways", "https://gw:443", "--ca-file", "ca.pem"],
    ] {
        let gateways = match parse(words).unwrap() {
            Command::Steady(s) => s.target.gateways,
            Command::Probe(p) => p.gateways,
            Command::Sends(s) => s.gateways,
            _ => panic!("{words:?}"),
        };
        assert_eq!(gateways.ca_file.as_deref(), Some(std::path::Path::new("ca.pem")), "{words:?}");
    }
    let Command::Steady(s) = parse(&["steady", "--ca-file", "/nonexistent/ca.pem"]).unwrap() else { panic!("steady") };
    let err = s.target.gateways.tls().unwrap_err().to_string();
    assert!(err.contains("cannot read /nonexistent/ca.pem"), "{err}");
    let Command::Steady(s) = parse(&["steady"]).unwrap() else { panic!("steady") };
    assert!(s.target.gateways.tls().is_ok(), "the system's roots");
}

#[test]
fn typing_takes_its_rates_with_defaults() {
    let Command::Typing(t) = parse(&["typing"]).unwrap() else { panic!("typing") };
    assert_eq!((t.receivers, t.group, t.rate, t.duration, t.churn), (2000, 50, 500.0, 20.0, 20.0));
    let Command::Typing(t) = parse(&["typing", "--group", "5", "--rate", "8", "--churn", "0"]).unwrap() else {
        panic!("typing")
    };
    assert_eq!((t.group, t.rate, t.churn), (5, 8.0, 0.0));
    assert!(parse(&["typing", "--rate", "fast"]).is_err());
}
