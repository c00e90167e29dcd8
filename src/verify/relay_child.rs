//! `verify --spawn`: the relay as `verify`'s own child (`outboxd run --config <file>`, this
//! same binary), and with `--faults kill` killed with SIGKILL and started again, as a crash
//! would. Only this child is ever signalled: `verify` never looks for other processes.
//! Its output goes to a log file whose path the report gives.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A graceful stop (SIGTERM) waits at most this long before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

pub(crate) struct RelayChild {
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// How many times it was killed on purpose.
    pub(crate) kills: u32,
}

impl RelayChild {
    /// Starts `outboxd run --config <config>`, its output appended to `log`.
    pub(crate) fn start(config: &Path, log: PathBuf) -> Result<Self, String> {
        let mut relay = Self {
            config: config.to_owned(),
            log,
            child: None,
            kills: 0,
        };
        relay.spawn()?;
        Ok(relay)
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    fn spawn(&mut self) -> Result<(), String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find outboxd's own binary to run the relay: {e}"))?;
        // A new file at the first start (never one someone else made), appended to after.
        let mut options = File::options();
        options.append(true);
        match self.child.is_none() && self.kills == 0 {
            true => options.create_new(true),
            false => options.create(true),
        };
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let output = options
            .open(&self.log)
            .map_err(|e| format!("cannot open the relay's log {}: {e}", self.log.display()))?;
        let errors = output
            .try_clone()
            .map_err(|e| format!("cannot open the relay's log {}: {e}", self.log.display()))?;
        let child = Command::new(exe)
            .arg("run")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start `outboxd run`: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// `Some(status)` when the relay has exited by itself.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// SIGKILL, then a new relay at once.
    pub(crate) async fn kill_and_restart(&mut self) -> Result<(), String> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
        self.kills += 1;
        self.spawn()
    }

    /// SIGTERM (outboxd's graceful shutdown), SIGKILL if it has not exited in time.
    pub(crate) async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            // The child's own pid, from the handle that started it; the shell's `kill`
            // builtin, so no procps is needed (a slim image has none) and no unsafe code.
            let _ = Command::new("sh")
                .args(["-c", &format!("kill -TERM {pid}")])
                .stdin(Stdio::null())
                .status()
                .await;
        }
        if tokio::time::timeout(STOP_GRACE, child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }

    /// The last `lines` lines of the relay's log, to show why it exited.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}
