use std::fmt;

/// Outcome of one `outboxd check` item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// Ready.
    Ok,
    /// Works, but something is worth attention (e.g. the slot does not exist yet and
    /// `init` will create it).
    Warn,
    /// `run` will fail until this is fixed.
    Fail,
}

/// One line of `outboxd check`: what was checked, what was found, and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckLine {
    /// What was checked, e.g. `wal_level`.
    pub item: String,
    /// The verdict.
    pub status: CheckStatus,
    /// What was found, e.g. `logical`.
    pub detail: String,
    /// For Warn and Fail: what to do about it.
    pub fix: Option<String>,
}

impl CheckLine {
    /// A passing check.
    pub fn ok(item: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            item: item.into(),
            status: CheckStatus::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A check that needs attention but does not stop `run`.
    pub fn warn(
        item: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            item: item.into(),
            status: CheckStatus::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A failing check, with its fix.
    pub fn fail(
        item: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            item: item.into(),
            status: CheckStatus::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

impl fmt::Display for CheckLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            CheckStatus::Ok => "ok  ",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "FAIL",
        };
        write!(f, "[{tag}] {:<24} {}", self.item, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n       fix: {fix}")?;
        }
        Ok(())
    }
}

/// All lines of a check, in order.
pub type CheckReport = Vec<CheckLine>;
