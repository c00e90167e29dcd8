//! Defaults of the `[source]` keys every engine has (`host`, `connect_timeout`); each
//! engine's config struct names them in its serde attributes, so the keys and their
//! defaults stay the same across engines.

use std::time::Duration;

/// `host`: the local server.
pub fn default_host() -> String {
    "127.0.0.1".into()
}

/// `connect_timeout`: time allowed to establish a connection.
pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}
