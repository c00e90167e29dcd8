//! `verify`'s progress line on stderr.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// One progress line on stderr: rewritten in place on a terminal, every 5 s otherwise;
/// none with `--json`.
pub(crate) struct Progress {
    terminal: bool,
    quiet: bool,
    last: std::sync::Mutex<Option<Instant>>,
}

impl Progress {
    pub(crate) fn new(quiet: bool) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            quiet,
            last: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn show(&self, line: impl FnOnce() -> String) {
        if self.quiet {
            return;
        }
        let every = if self.terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(5)
        };
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        *last = Some(Instant::now());
        if self.terminal {
            eprint!("\r\x1b[2K{}", line());
        } else {
            eprintln!("verify: {}", line());
        }
    }

    pub(crate) fn finish(&self) {
        if self.terminal && !self.quiet {
            eprint!("\r\x1b[2K");
        }
    }
}
