//! `[console]`: the operator console at `/ui` on the `[metrics]` address.

use std::path::PathBuf;
use std::time::Duration;

use outboxd_connector::Secret;
use serde::Deserialize;

/// Environment variable that sets `console.token`.
pub const ENV_CONSOLE_TOKEN: &str = "OUTBOXD_CONSOLE_TOKEN";

/// `[console]`: off when the section is absent.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// The credential an operator signs in with (required, at least 16 characters): the
    /// console's own, never the metrics token, which a scraper holds and which must not
    /// resolve rows. `OUTBOXD_CONSOLE_TOKEN` overrides it.
    pub token: Option<Secret>,
    /// File holding `token`.
    pub token_file: Option<PathBuf>,
    /// How long a sign-in lasts.
    #[serde(with = "humantime_serde")]
    pub session_ttl: Duration,
    /// Rows a list page shows.
    pub page_size: usize,
    /// Characters of a row's payload its page shows.
    pub payload_preview: usize,
    /// Marks the session cookie `Secure` (sent over HTTPS only): set it when a
    /// TLS-terminating proxy serves the console.
    pub secure_cookie: bool,
}

/// The shortest console token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            token: None,
            token_file: None,
            session_ttl: Duration::from_secs(8 * 3600),
            page_size: 50,
            payload_preview: 4096,
            secure_cookie: false,
        }
    }
}

impl ConsoleConfig {
    /// What makes no sense on its own; what needs the rest of the file (`[metrics]`, a
    /// credential) is checked by `Config::validate`.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.session_ttl < Duration::from_secs(60)
            || self.session_ttl > Duration::from_secs(7 * 86_400)
        {
            return Err("console.session_ttl must be between 1m and 7d".into());
        }
        if !(1..=500).contains(&self.page_size) {
            return Err("console.page_size must be between 1 and 500".into());
        }
        if !(64..=1_048_576).contains(&self.payload_preview) {
            return Err("console.payload_preview must be between 64 and 1048576 characters".into());
        }
        match (&self.token, &self.token_file) {
            (None, None) => Err(
                "[console] needs its own credential: set console.token_file (a file holding a \
                 random token of 16 characters or more) or OUTBOXD_CONSOLE_TOKEN; the metrics \
                 token is not taken, a scraper holds it"
                    .into(),
            ),
            (Some(token), _) if token.expose().chars().count() < MIN_TOKEN_CHARS => Err(format!(
                "console.token is shorter than {MIN_TOKEN_CHARS} characters: make a random one, \
                 e.g. `openssl rand -hex 24`"
            )),
            _ => Ok(()),
        }
    }
}
