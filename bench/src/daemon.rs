//! outboxd as a child process, its configuration, and its resource use from `/proc/<pid>`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

/// Linux's USER_HZ, the unit of utime/stime in /proc/<pid>/stat.
const TICKS_PER_SECOND: f64 = 100.0;

/// Where the servers are.
#[derive(Clone, Debug)]
pub(crate) struct Services {
    pub(crate) pg_host: String,
    pub(crate) pg_port: u16,
    pub(crate) pg_user: String,
    pub(crate) pg_password: String,
    pub(crate) pg_database: String,
    pub(crate) pg_bin: PathBuf,
    pub(crate) kafka: String,
    pub(crate) mysql_host: String,
    pub(crate) mysql_port: u16,
    pub(crate) mysql_user: String,
    pub(crate) mysql_password: String,
    pub(crate) mysql_database: String,
}

impl Services {
    pub(crate) fn conn_string(&self) -> String {
        format!(
            "host={} port={} user={} password={} dbname={}",
            self.pg_host, self.pg_port, self.pg_user, self.pg_password, self.pg_database
        )
    }

    pub(crate) fn mysql_url(&self) -> String {
        format!(
            "mysql://{}:{}@{}:{}/{}",
            self.mysql_user,
            self.mysql_password,
            self.mysql_host,
            self.mysql_port,
            self.mysql_database
        )
    }
}

/// Which source a bench pipeline reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// PostgreSQL, logical replication.
    PgLog,
    /// PostgreSQL, `source.mode = "poll"`.
    PgPoll,
    /// MariaDB (or MySQL), binlog.
    Mysql,
}

/// One pipeline of the bench: its names and config file.
#[derive(Clone, Debug)]
pub(crate) struct BenchPipeline {
    pub(crate) name: String,
    pub(crate) table: String,
    pub(crate) topic: String,
    pub(crate) config: PathBuf,
    pub(crate) metrics_port: u16,
    pub(crate) source: Source,
}

impl BenchPipeline {
    /// Writes the config file.
    pub(crate) fn write(
        dir: &Path,
        services: &Services,
        name: &str,
        topic: &str,
        source: Source,
        extra: &str,
    ) -> anyhow::Result<Self> {
        let table = format!("outbox_{name}");
        let metrics_port = free_port()?;
        let source_section = match source {
            Source::PgLog | Source::PgPoll => format!(
                "kind = \"postgres\"\n{mode}host = \"{}\"\nport = {}\nuser = \"{}\"\n\
                 password = \"{}\"\ndatabase = \"{}\"\nsslmode = \"disable\"\n",
                services.pg_host,
                services.pg_port,
                services.pg_user,
                services.pg_password,
                services.pg_database,
                mode = if source == Source::PgPoll {
                    "mode = \"poll\"\n"
                } else {
                    ""
                },
            ),
            Source::Mysql => format!(
                "kind = \"mysql\"\nhost = \"{}\"\nport = {}\nuser = \"{}\"\n\
                 password = \"{}\"\ndatabase = \"{}\"\nsslmode = \"disable\"\nserver_id = {}\n",
                services.mysql_host,
                services.mysql_port,
                services.mysql_user,
                services.mysql_password,
                services.mysql_database,
                40_000 + metrics_port % 20_000,
            ),
        };
        let text = format!(
            r#"[pipeline]
name = "{name}"

[source]
{source_section}
[outbox]
table = "{table}"

[kafka]
bootstrap_servers = "{kafka}"
topic_template = "{topic}"

[metrics]
listen = "127.0.0.1:{metrics_port}"
{extra}
"#,
            kafka = services.kafka,
        );
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        Ok(Self {
            name: name.to_owned(),
            table,
            topic: topic.to_owned(),
            config,
            metrics_port,
            source,
        })
    }
}

/// A port nobody listens on right now.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Runs `outboxd <command> --config <file>` to completion.
pub(crate) async fn outboxd_once(
    bin: &Path,
    command: &str,
    config: &Path,
) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .arg(command)
        .arg("--config")
        .arg(config)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    anyhow::ensure!(out.status.success(), "outboxd {command} failed:\n{text}");
    Ok(text)
}

/// A running `outboxd run`.
pub(crate) struct Daemon {
    child: Child,
    pid: u32,
    pub(crate) log: PathBuf,
}

/// Resource use of a process.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProcSample {
    /// Peak resident set size (VmHWM), bytes.
    pub(crate) peak_rss: u64,
    /// User + system CPU time, seconds.
    pub(crate) cpu_seconds: f64,
}

impl Daemon {
    pub(crate) fn spawn(bin: &Path, config: &Path, log: PathBuf) -> anyhow::Result<Self> {
        let file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(config)
            .env("OUTBOXD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let pid = child.id().context("outboxd exited at once")?;
        Ok(Self { child, pid, log })
    }

    pub(crate) fn sample(&self) -> Option<ProcSample> {
        sample_pid(self.pid)
    }

    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, and waits for the process to be gone.
    pub(crate) async fn kill9(mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, then waits up to `deadline` for a clean exit.
    pub(crate) async fn terminate(mut self, deadline: Duration) -> anyhow::Result<i32> {
        signal(self.pid, "-TERM");
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(status) => Ok(status?.code().unwrap_or(-1)),
            Err(_) => {
                let _ = self.child.kill().await;
                anyhow::bail!("outboxd did not stop within {deadline:?} of SIGTERM")
            }
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

pub(crate) fn sample_pid(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(ProcSample {
        peak_rss: hwm_kib * 1024,
        cpu_seconds: (utime + stime) as f64 / TICKS_PER_SECOND,
    })
}

/// GET `path` on `127.0.0.1:port` with a bare HTTP/1.1 request; (status, body).
pub(crate) async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Sends `which` (`-STOP`, `-CONT`, `-TERM`, …) to `pid` with kill(1); false if it failed.
pub(crate) fn signal(pid: u32, which: &str) -> bool {
    std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The Kafka broker's pid, from the pid file `scripts/services` writes.
pub(crate) fn kafka_pid() -> Option<u32> {
    let services = std::env::var("OUTBOXD_SERVICES_DIR")
        .unwrap_or_else(|_| "/var/tmp/outboxd-services".into());
    std::fs::read_to_string(format!("{services}/kafka/kafka.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
}

/// CPU seconds spent so far by PostgreSQL (every process of the cluster in
/// `$OUTBOXD_TEST_PG_DATA`, plus the children its postmaster has reaped, such as the
/// walsender of a finished pg_recvlogical), by the Kafka broker, and by this process's
/// waited-for children (pg_recvlogical, the Java tools, outboxd daemons that exited).
/// Differences of two snapshots give a phase's CPU budget.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CpuSnapshot {
    pub(crate) postgres: f64,
    pub(crate) kafka: f64,
    pub(crate) children: f64,
}

impl CpuSnapshot {
    pub(crate) fn take() -> Self {
        let mut postgres = 0.0;
        let mut comms = std::collections::HashMap::new();
        let mut stats = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(stat) = proc_stat(pid) {
                    comms.insert(pid, stat.comm.clone());
                    stats.push((pid, stat));
                }
            }
        }
        // Our cluster's postmaster (other clusters on the machine, e.g. a CI run's, are not
        // ours to count); without its pid file, every PostgreSQL on the machine.
        let postmaster: Option<u32> = std::env::var("OUTBOXD_TEST_PG_DATA")
            .ok()
            .and_then(|dir| std::fs::read_to_string(format!("{dir}/postmaster.pid")).ok())
            .and_then(|text| text.lines().next()?.trim().parse().ok());
        for (pid, stat) in &stats {
            if stat.comm != "postgres" {
                continue;
            }
            let is_postmaster = match postmaster {
                Some(pm) => *pid == pm,
                None => comms.get(&stat.ppid).is_none_or(|c| c != "postgres"),
            };
            if postmaster.is_none_or(|pm| is_postmaster || stat.ppid == pm) {
                postgres += stat.own;
            }
            if is_postmaster {
                postgres += stat.children;
            }
        }
        let kafka = kafka_pid().and_then(proc_stat).map_or(0.0, |s| s.own);
        let children = proc_stat(std::process::id()).map_or(0.0, |s| s.children);
        Self {
            postgres,
            kafka,
            children,
        }
    }

    /// CPU seconds per million events since `earlier`.
    pub(crate) fn per_million_since(&self, earlier: &Self, events: usize) -> Self {
        let per_m = |now: f64, then: f64| (now - then).max(0.0) / events.max(1) as f64 * 1e6;
        Self {
            postgres: per_m(self.postgres, earlier.postgres),
            kafka: per_m(self.kafka, earlier.kafka),
            children: per_m(self.children, earlier.children),
        }
    }
}

struct ProcStat {
    comm: String,
    ppid: u32,
    /// utime + stime, seconds.
    own: f64,
    /// cutime + cstime (waited-for children), seconds.
    children: f64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick =
        |i: usize| -> Option<f64> { Some(fields.get(i)?.parse::<f64>().ok()? / TICKS_PER_SECOND) };
    Some(ProcStat {
        comm,
        ppid: fields.get(1)?.parse().ok()?,
        own: tick(11)? + tick(12)?,
        children: tick(13)? + tick(14)?,
    })
}
