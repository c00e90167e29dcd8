//! The TLS mode of an engine's `[source]`.

use serde::Deserialize;

/// How to use TLS on the SQL and log connections (libpq's `sslmode`, the subset that does
/// not verify certificates; verification belongs in a later version). Config key
/// `sslmode`, values `disable`, `prefer` (default) and `require`, for every engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain TCP otherwise.
    #[default]
    Prefer,
    /// TLS or fail.
    Require,
}
