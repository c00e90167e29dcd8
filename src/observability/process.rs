//! `process_resident_memory_bytes` and `process_cpu_seconds_total`, read from
//! `/proc/self` on each scrape.
//!
//! Written here rather than taken from a crate: `prometheus-client` has no process
//! collector, and the crates that do (`procfs`, or the `prometheus` crate's collector built
//! on it) bring a whole `/proc` model and its dependencies for two numbers out of two
//! files. On a system without `/proc` the two series are simply absent.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Encodes the process series of this process at each scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(process) = ProcessStats::read_self() else {
            return Ok(());
        };
        let rss = ConstGauge::new(process.rss_bytes);
        rss.encode(encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            None,
            rss.metric_type(),
        )?)?;
        let cpu = ConstCounter::new(process.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        Ok(())
    }
}

/// Resident memory and CPU time of this process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ProcessStats {
    rss_bytes: u64,
    cpu_seconds: f64,
}

impl ProcessStats {
    /// Linux's USER_HZ, the unit of `utime`/`stime` in `/proc/<pid>/stat`: 100 on every
    /// mainstream architecture.
    const TICKS_PER_SECOND: f64 = 100.0;

    fn read_self() -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Self::parse(&status, &stat)
    }

    /// From the text of `/proc/<pid>/status` and `/proc/<pid>/stat`.
    fn parse(status: &str, stat: &str) -> Option<Self> {
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(Self {
            rss_bytes: rss_kib * 1024,
            cpu_seconds: (utime + stime) as f64 / Self::TICKS_PER_SECOND,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let status = "Name:\toutboxd\nVmPeak:\t  20000 kB\nVmRSS:\t   12345 kB\nThreads:\t9\n";
        // A command name with a space and a parenthesis, as /proc allows.
        let stat = "4242 (out) boxd) S 1 4242 4242 0 -1 4194560 3000 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(
            ProcessStats::parse(status, stat),
            Some(ProcessStats {
                rss_bytes: 12345 * 1024,
                cpu_seconds: 3.0,
            })
        );
        assert_eq!(ProcessStats::parse("Name:\tx\n", stat), None);
        assert_eq!(ProcessStats::parse(status, "4242 (x) S 1"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = ProcessStats::read_self().expect("/proc/self on Linux");
        assert!(me.rss_bytes > 0);
    }
}
