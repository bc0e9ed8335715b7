//! The standard process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_open_fds`), read from `/proc/self` when
//! `/metrics` is scraped, so the CPU and memory of every Herald process can be measured
//! the same way on a laptop and in Kubernetes. Linux only; elsewhere they are absent.

/// Clock ticks per second of `/proc/*/stat` times (`USER_HZ`, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// What `/proc/self` says about this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub open_fds: u64,
}

/// CPU seconds (user + system) from a `/proc/<pid>/stat` line.
pub fn cpu_seconds_of_stat(stat: &str) -> Option<f64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ... utime is field 14 of the line, index 11 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

/// Resident memory in bytes from `/proc/<pid>/status` (`VmRSS`, in kB).
pub fn resident_bytes_of_status(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Samples this process; `None` where `/proc` is not there.
pub fn sample() -> Option<ProcessSample> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    Some(ProcessSample {
        cpu_seconds: cpu_seconds_of_stat(&stat)?,
        resident_bytes: resident_bytes_of_status(&status)?,
        open_fds: std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0),
    })
}

/// Sets the gauges from a fresh sample (called before `/metrics` renders).
pub fn record() {
    if let Some(s) = sample() {
        metrics::gauge!("process_cpu_seconds_total").set(s.cpu_seconds);
        metrics::gauge!("process_resident_memory_bytes").set(s.resident_bytes as f64);
        metrics::gauge!("process_open_fds").set(s.open_fds as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_status_lines_are_read_as_proc_writes_them() {
        let stat = "4242 (herald (gw) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 1000000 500";
        assert_eq!(cpu_seconds_of_stat(stat), Some(3.25));
        assert_eq!(resident_bytes_of_status("Name:\tx\nVmRSS:\t  2048 kB\nThreads:\t9\n"), Some(2 * 1024 * 1024));
        assert_eq!(cpu_seconds_of_stat("garbage"), None);
    }

    #[test]
    fn this_process_can_be_sampled() {
        let s = sample().expect("a Linux /proc");
        assert!(s.resident_bytes > 0 && s.open_fds > 0);
    }
}
