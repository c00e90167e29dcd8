//! Signing in to the console: its own credential (`console.token`; never the metrics
//! token, which a scraper holds) exchanged on a form for a session cookie, and a CSRF
//! token per session on every form that changes something.
//!
//! A browser cannot send the bearer header the other routes take, so the console has its
//! own door: `POST /ui/login` hashes the given and the expected token and compares the
//! digests in constant time (so neither the length nor a matching prefix shows in the
//! answer's time), refuses at once past ten wrong tokens in ten seconds, and, when they
//! match, sets `outboxd_console=<session>` with `HttpOnly` (no script reads it),
//! `SameSite=Strict` (no other site's page sends it), `Path=/ui` and, with
//! `console.secure_cookie`, `Secure`. Sessions live in memory: a restart signs everyone
//! out, which is the safe side. Each session has its own random CSRF token, which every
//! action form carries and the action checks, so a forged cross-site POST fails even in a
//! browser that ignores `SameSite`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outboxd_console";
/// Sessions kept at once; the oldest go first past it (each sign-in makes one).
const MAX_SESSIONS: usize = 256;
/// The longest operator name kept (shown in the log and in `last_error`).
const MAX_NAME: usize = 64;
/// Wrong tokens accepted within [`FAILURE_WINDOW`], from anyone; past that, sign-ins are
/// refused at once (429) until the window has room. Guessing a random token at ten tries
/// in ten seconds is hopeless, and no connection is held waiting.
const MAX_FAILURES: usize = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(10);

/// One signed-in operator.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    /// The name given at sign-in, for the log and the rows' notes.
    pub(crate) operator: String,
    /// The token every action form must carry.
    pub(crate) csrf: String,
    expires: Instant,
}

/// The sessions of one running console.
pub(crate) struct Sessions {
    ttl: Duration,
    secure: bool,
    by_id: Mutex<HashMap<String, Session>>,
    /// When the latest wrong tokens were given (at most [`MAX_FAILURES`]).
    failures: Mutex<VecDeque<Instant>>,
}

impl Sessions {
    /// Sessions lasting `ttl`, their cookie `Secure` when `secure`.
    pub(crate) fn new(ttl: Duration, secure: bool) -> Self {
        Self {
            ttl,
            secure,
            by_id: Mutex::new(HashMap::new()),
            failures: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether a sign-in may be tried now: fewer than [`MAX_FAILURES`] wrong tokens in
    /// the last [`FAILURE_WINDOW`].
    pub(crate) fn sign_in_allowed(&self) -> bool {
        let mut failures = lock(&self.failures);
        let now = Instant::now();
        while failures
            .front()
            .is_some_and(|at| now.duration_since(*at) >= FAILURE_WINDOW)
        {
            failures.pop_front();
        }
        failures.len() < MAX_FAILURES
    }

    /// A wrong token was given.
    pub(crate) fn sign_in_failed(&self) {
        let mut failures = lock(&self.failures);
        failures.push_back(Instant::now());
        while failures.len() > MAX_FAILURES {
            failures.pop_front();
        }
    }

    /// A new session for `operator`; returns its id (the cookie's value).
    pub(crate) fn open(&self, operator: &str) -> String {
        let id = random_token();
        let session = Session {
            operator: clean_name(operator),
            csrf: random_token(),
            expires: Instant::now() + self.ttl,
        };
        let mut sessions = lock(&self.by_id);
        let now = Instant::now();
        sessions.retain(|_, s| s.expires > now);
        while sessions.len() >= MAX_SESSIONS {
            let Some(oldest) = (sessions.iter())
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), session);
        id
    }

    /// The live session of the request's cookie header, if any.
    pub(crate) fn find(&self, cookie_header: Option<&str>) -> Option<Session> {
        let id = cookie_value(cookie_header?, COOKIE)?;
        let sessions = lock(&self.by_id);
        sessions
            .get(id)
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }

    /// Ends the session of the cookie header.
    pub(crate) fn close(&self, cookie_header: Option<&str>) {
        if let Some(id) = cookie_header.and_then(|h| cookie_value(h, COOKIE)) {
            lock(&self.by_id).remove(id);
        }
    }

    /// The `Set-Cookie` value for session `id`.
    pub(crate) fn cookie(&self, id: &str) -> String {
        format!(
            "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
            self.ttl.as_secs(),
            if self.secure { "; Secure" } else { "" }
        )
    }
}

/// The `Set-Cookie` value that removes the session cookie.
pub(crate) fn expired_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// Equal, in time that tells nothing of either: both are hashed first, so neither the
/// length nor the first differing byte shows in the answer's time.
pub(crate) fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (
        Sha256::digest(given.as_bytes()),
        Sha256::digest(expected.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |diff, (x, y)| diff | (x ^ y))
        == 0
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// 32 random bytes from the operating system's generator, URL-safe base64.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The operator's name as given, without control characters, cut to [`MAX_NAME`];
/// `operator` when empty.
fn clean_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME)
        .collect();
    match cleaned.trim() {
        "" => "operator".into(),
        trimmed => trimmed.into(),
    }
}

/// The value of cookie `name` in a `Cookie` header.
fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name && !value.is_empty()).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_session_is_found_by_its_cookie_until_it_expires_or_closes() {
        let sessions = Sessions::new(Duration::from_secs(60), false);
        let id = sessions.open("ana\n<b>");
        let header = format!("other=1; {COOKIE}={id}");
        let session = sessions.find(Some(&header)).expect("signed in");
        assert_eq!(session.operator, "ana<b>", "control characters dropped");
        assert_ne!(session.csrf, id, "the CSRF token is not the session id");
        assert!(sessions.find(Some(&format!("{COOKIE}=forged"))).is_none());
        assert!(sessions.find(None).is_none());
        assert!(sessions.cookie(&id).contains("HttpOnly; SameSite=Strict"));

        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(sessions.find(Some(&header)).is_none(), "expired");

        let id = sessions.open("");
        let header = format!("{COOKIE}={id}");
        assert_eq!(
            sessions.find(Some(&header)).expect("new").operator,
            "operator"
        );
        sessions.close(Some(&header));
        assert!(sessions.find(Some(&header)).is_none(), "signed out");
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60), true);
        assert!(sessions.cookie("x").ends_with("; Secure"));
        for _ in 0..(MAX_SESSIONS + 10) {
            sessions.open("x");
        }
        assert_eq!(lock(&sessions.by_id).len(), MAX_SESSIONS);
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_are_limited_for_everyone() {
        let sessions = Sessions::new(Duration::from_secs(60), false);
        for _ in 0..MAX_FAILURES {
            assert!(sessions.sign_in_allowed());
            sessions.sign_in_failed();
        }
        assert!(
            !sessions.sign_in_allowed(),
            "the eleventh try in ten seconds"
        );
        tokio::time::advance(FAILURE_WINDOW).await;
        assert!(
            sessions.sign_in_allowed(),
            "room again once the window passed"
        );
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc"));
        assert!(!same_secret("ab", "abc"));
    }
}
