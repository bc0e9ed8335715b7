//! The standard process metrics of Prometheus's client libraries, read from `/proc` when
//! `/metrics` is scraped, so the CPU and memory of every Herald process can be measured
//! the same way on a laptop and in Kubernetes. Linux only; elsewhere they are absent.
//!
//! They are written as exposition text next to the recorder's, not through the
//! `metrics` facade: its counters are whole numbers, and `process_cpu_seconds_total`
//! is a counter of fractional seconds (a gauge of it, as this once was, breaks
//! `rate()` conventions and tools that check types). Names, types and help come from
//! the metric catalog.

use std::fmt::Write as _;

use crate::metric_catalog::{Kind, METRICS};

/// Clock ticks per second of `/proc/*/stat` times (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// What `/proc` says about this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    /// The soft limit of open files (`Max open files`); `None` when unlimited.
    pub max_fds: Option<u64>,
    /// Since the Unix epoch.
    pub start_time_seconds: f64,
    pub threads: u64,
}

/// The fields of a `/proc/<pid>/stat` line after the command name, which may hold
/// spaces and parentheses: they start after the last ')'. Index 0 is the state.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// Write system calls this thread has made (`syscw` of `/proc/thread-self/io`), for the
/// tests that count what reaches a socket: a current-thread runtime runs a Redis
/// client's connection task on its own thread. `None` where `/proc` does not say.
pub fn thread_write_calls() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
    io.lines().find_map(|l| l.strip_prefix("syscw: ")).and_then(|n| n.trim().parse().ok())
}

/// CPU seconds (user + system) from a `/proc/<pid>/stat` line.
pub fn cpu_seconds_of_stat(stat: &str) -> Option<f64> {
    let fields = stat_fields(stat)?;
    // utime is field 14 of the line, index 11 here; stime follows.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Seconds after boot at which the process started (field 22, `starttime`).
fn start_after_boot_of_stat(stat: &str) -> Option<f64> {
    let ticks: f64 = stat_fields(stat)?.get(19)?.parse().ok()?;
    Some(ticks / USER_HZ)
}

/// A `/proc/<pid>/status` field in kB, as bytes (`VmRSS`, `VmSize`).
fn status_bytes(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident memory in bytes from `/proc/<pid>/status` (`VmRSS`, in kB).
pub fn resident_bytes_of_status(status: &str) -> Option<u64> {
    status_bytes(status, "VmRSS")
}

/// The soft `Max open files` of `/proc/<pid>/limits`; `None` when unlimited or absent.
fn max_fds_of_limits(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// The boot time (`btime`) of `/proc/stat`, in seconds since the epoch.
fn boot_time_of_stat(stat: &str) -> Option<f64> {
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

/// Samples this process; `None` where `/proc` is not there.
pub fn sample() -> Option<ProcessSample> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let stat = read("/proc/self/stat")?;
    let status = read("/proc/self/status")?;
    let boot = read("/proc/stat").and_then(|s| boot_time_of_stat(&s)).unwrap_or(0.0);
    Some(ProcessSample {
        cpu_seconds: cpu_seconds_of_stat(&stat)?,
        resident_bytes: resident_bytes_of_status(&status)?,
        virtual_bytes: status_bytes(&status, "VmSize").unwrap_or(0),
        open_fds: std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0),
        max_fds: read("/proc/self/limits").and_then(|l| max_fds_of_limits(&l)),
        start_time_seconds: boot + start_after_boot_of_stat(&stat).unwrap_or(0.0),
        threads: status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
    })
}

/// The exposition text of a sample: `# HELP`, `# TYPE` and the value of each process
/// metric of the catalog (a metric without a value, like an unlimited `process_max_fds`,
/// is left out).
pub fn render(s: &ProcessSample) -> String {
    let value = |name: &str| -> Option<f64> {
        Some(match name {
            "process_cpu_seconds_total" => s.cpu_seconds,
            "process_resident_memory_bytes" => s.resident_bytes as f64,
            "process_virtual_memory_bytes" => s.virtual_bytes as f64,
            "process_open_fds" => s.open_fds as f64,
            "process_max_fds" => s.max_fds? as f64,
            "process_start_time_seconds" => s.start_time_seconds,
            "process_threads" => s.threads as f64,
            _ => return None,
        })
    };
    let mut out = String::new();
    for m in METRICS.iter().filter(|m| m.name.starts_with("process_")) {
        let Some(v) = value(m.name) else { continue };
        let kind = match m.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n", name = m.name, help = m.help);
    }
    out
}

/// The process metrics of this process now, as exposition text ("" without `/proc`).
pub fn rendered() -> String {
    sample().map(|s| render(&s)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str =
        "4242 (herald (gw) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 12345 1000000 500";

    #[test]
    fn proc_files_are_read_as_linux_writes_them() {
        assert_eq!(cpu_seconds_of_stat(STAT), Some(3.25));
        assert_eq!(start_after_boot_of_stat(STAT), Some(123.45));
        let status = "Name:\tx\nVmSize:\t  4096 kB\nVmRSS:\t  2048 kB\nThreads:\t9\n";
        assert_eq!(resident_bytes_of_status(status), Some(2 * 1024 * 1024));
        assert_eq!(status_bytes(status, "VmSize"), Some(4 * 1024 * 1024));
        assert_eq!(cpu_seconds_of_stat("garbage"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_fds_of_limits(limits), Some(1024));
        assert_eq!(
            max_fds_of_limits("Max open files            unlimited            unlimited            files\n"),
            None
        );
        assert_eq!(boot_time_of_stat("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"), Some(1.7e9));
    }

    /// The types follow Prometheus's conventions: CPU seconds are a counter (it was a
    /// gauge), the rest gauges, each with its help.
    #[test]
    fn the_rendering_types_cpu_as_a_counter_and_the_rest_as_gauges() {
        let s = ProcessSample {
            cpu_seconds: 3.25,
            resident_bytes: 2048,
            virtual_bytes: 4096,
            open_fds: 7,
            max_fds: None,
            start_time_seconds: 1.7e9,
            threads: 9,
        };
        let text = render(&s);
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.25\n"), "{text}");
        for gauge in
            ["process_resident_memory_bytes 2048", "process_open_fds 7", "process_start_time_seconds 1700000000"]
        {
            let name = gauge.split(' ').next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} gauge\n{gauge}\n")), "{text}");
            assert!(text.contains(&format!("# HELP {name} ")), "{text}");
        }
        assert!(!text.contains("process_max_fds"), "unlimited is left out: {text}");
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample().expect("a Linux /proc");
        assert!(s.resident_bytes > 0 && s.open_fds > 0 && s.threads > 0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!((now - 86_400.0 * 365.0..=now + 1.0).contains(&s.start_time_seconds), "{}", s.start_time_seconds);
    }
}
