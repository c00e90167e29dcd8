//! The bytes the guard looks at, without I/O: the server's greeting, its packets during
//! authentication, and the client's handshake response (its token, the SSLRequest made
//! of it). Everything here reads what whoever answers sent, so nothing trusts a length or
//! an offset without checking it.

use std::fmt;

/// `CLIENT_SSL`: the server offers TLS (greeting), the client asks for it (response).
pub(super) const CLIENT_SSL: u32 = 0x0000_0800;
/// `CLIENT_CONNECT_ATTRS`: the response ends with connection attributes.
const CLIENT_CONNECT_ATTRS: u32 = 0x0010_0000;
/// The fixed part of a handshake response (capabilities, max packet, charset, filler,
/// MariaDB's capabilities): also the whole of an SSLRequest.
const RESPONSE_HEADER: usize = 32;

/// caching_sha2_password: its full authentication sends the password (in clear over TLS,
/// RSA-encrypted with a key the server sends otherwise).
pub(super) const CACHING_SHA2: &str = "caching_sha2_password";
/// mysql_clear_password: the password itself, in clear.
pub(super) const CLEAR_PASSWORD: &str = "mysql_clear_password";

/// An authentication method that hands the password (or what stands for it) to the
/// server, asked for over a channel whose server is not verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exposing {
    /// The account's plugin is caching_sha2_password (an AuthSwitchRequest to it, or its
    /// answer to the client's scramble).
    CachingSha2,
    /// The server asks for mysql_clear_password.
    ClearPassword,
}

impl Exposing {
    pub(crate) fn plugin(self) -> &'static str {
        match self {
            Exposing::CachingSha2 => CACHING_SHA2,
            Exposing::ClearPassword => CLEAR_PASSWORD,
        }
    }

    /// How the password would travel, for the refusal.
    pub(crate) fn how(self) -> &'static str {
        match self {
            Exposing::CachingSha2 => {
                "whose full authentication (on every cache miss: after a restart of the \
                 server, FLUSH PRIVILEGES, a password change, or whenever whoever answers \
                 asks for it) sends the password in clear inside TLS, or encrypted with an \
                 RSA key the server itself supplies"
            }
            Exposing::ClearPassword => "which sends the password in clear",
        }
    }
}

impl fmt::Display for Exposing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.plugin())
    }
}

/// What the guard needs of the server's greeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Greeting {
    /// A protocol v10 greeting.
    V10 {
        /// The server's capability flags.
        capabilities: u32,
        /// The authentication plugin it names (its default; the account's may differ).
        plugin: Option<String>,
    },
    /// An error packet instead (too many connections, host blocked): the client reads
    /// it and fails; nothing to guard.
    Error,
}

/// A packet the guard cannot read as the protocol says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unexpected {0} from the server")]
pub(crate) struct Malformed(pub(crate) &'static str);

/// Reads the greeting (the payload of the server's first packet).
pub(super) fn greeting(payload: &[u8]) -> Result<Greeting, Malformed> {
    const BAD: Malformed = Malformed("greeting");
    match payload.first() {
        Some(0xff) => return Ok(Greeting::Error),
        Some(10) => {}
        _ => return Err(BAD),
    }
    // protocol version, server version (NUL-terminated), connection id (4), first 8
    // bytes of the scramble, a filler byte, the capabilities' low half.
    let version_end = payload[1..].iter().position(|b| *b == 0).ok_or(BAD)? + 1;
    let mut at = version_end + 1 + 4 + 8 + 1;
    let low = u16_at(payload, at).ok_or(BAD)?;
    at += 2;
    // A pre-4.1 greeting ends here: no plugin, no high half.
    let Some(rest) = payload.get(at..).filter(|r| !r.is_empty()) else {
        return Ok(Greeting::V10 {
            capabilities: u32::from(low),
            plugin: None,
        });
    };
    // charset (1), status (2), the capabilities' high half (2), scramble length (1),
    // reserved (10), the scramble's second part, the plugin name.
    let high = u16_at(rest, 3).ok_or(BAD)?;
    let capabilities = u32::from(low) | u32::from(high) << 16;
    let scramble_len = usize::from(*rest.get(5).ok_or(BAD)?);
    let mut plugin = None;
    const PLUGIN_AUTH: u32 = 0x0008_0000;
    const SECURE_CONNECTION: u32 = 0x0000_8000;
    if capabilities & SECURE_CONNECTION != 0 {
        let second = scramble_len.saturating_sub(8).max(13);
        let name_at = 6 + 10 + second;
        if capabilities & PLUGIN_AUTH != 0 {
            if let Some(name) = rest.get(name_at..) {
                plugin = Some(nul_terminated(name));
            }
        }
    }
    Ok(Greeting::V10 {
        capabilities,
        plugin,
    })
}

/// What to do with a packet the server sent while the client authenticates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Pass it on; authentication goes on.
    Forward,
    /// Pass it on; it ends authentication (OK or error).
    Last,
    /// Do not pass it on: the client would answer with the password.
    Refuse(Exposing),
}

/// The authentication exchange as seen from the server's side.
#[derive(Clone, Debug, Default)]
pub(super) struct AuthWatch {
    /// The plugin the client authenticates with now: the greeting's, then any switch's.
    plugin: Option<String>,
}

impl AuthWatch {
    /// Starts from the plugin of the client's first answer, as mysql_async picks it from
    /// the greeting: caching_sha2_password when named, mysql_native_password otherwise.
    pub(super) fn new(greeting_plugin: Option<&str>) -> Self {
        let first = match greeting_plugin {
            Some(CACHING_SHA2) => CACHING_SHA2,
            _ => "mysql_native_password",
        };
        Self {
            plugin: Some(first.to_owned()),
        }
    }

    /// The verdict on the server's `payload`.
    pub(super) fn server_packet(&mut self, payload: &[u8]) -> Verdict {
        match payload.first() {
            // A progress report (an error packet with code 0xffff) is skipped by a
            // client that asked for them, and authentication goes on: watch on.
            Some(0xff) if payload.get(1..3) == Some(&[0xff, 0xff]) => Verdict::Forward,
            // OK, or an error: the client's authentication is over either way.
            Some(0x00 | 0xff) => Verdict::Last,
            // Nothing a client authenticates with; it fails on it.
            None => Verdict::Forward,
            // AuthSwitchRequest (a lone 0xfe is the pre-4.1 switch to
            // mysql_old_password, which the driver refuses: secure_auth).
            Some(0xfe) => {
                let name = nul_terminated(&payload[1..]);
                let verdict = match name.as_str() {
                    CACHING_SHA2 => Verdict::Refuse(Exposing::CachingSha2),
                    CLEAR_PASSWORD => Verdict::Refuse(Exposing::ClearPassword),
                    _ => Verdict::Forward,
                };
                self.plugin = Some(name);
                verdict
            }
            // AuthMoreData. Under caching_sha2_password the answer to the scramble:
            // 0x03 (it matched the server's cache) or 0x04 (send the password). Both are
            // refused: the account authenticates with caching_sha2_password, so the next
            // cache miss would ask for the password, and whoever answers decides when
            // that is; a refusal that waits for it would stop a running pipeline at the
            // server's next restart instead of at the first connection. Other plugins
            // (MariaDB's parsec) use AuthMoreData for their own exchange.
            Some(0x01) if self.plugin.as_deref() == Some(CACHING_SHA2) => {
                Verdict::Refuse(Exposing::CachingSha2)
            }
            Some(_) => Verdict::Forward,
        }
    }
}

/// The connection attribute that marks the guard's own client.
pub(super) const TOKEN_ATTRIBUTE: &str = "outboxd_guard";

/// The bytes a handshake response ends with when the client's only connection attribute
/// is [`TOKEN_ATTRIBUTE`] = `token` (mysql_async puts the attributes last).
fn token_suffix(token: &str) -> Option<Vec<u8>> {
    let (key, value) = (TOKEN_ATTRIBUTE.as_bytes(), token.as_bytes());
    // One-byte length-encoded integers only: both are short.
    let key_len = u8::try_from(key.len()).ok().filter(|n| *n < 251)?;
    let value_len = u8::try_from(value.len()).ok().filter(|n| *n < 251)?;
    let total = u8::try_from(key.len() + value.len() + 2)
        .ok()
        .filter(|n| *n < 251)?;
    let mut suffix = vec![total, key_len];
    suffix.extend_from_slice(key);
    suffix.push(value_len);
    suffix.extend_from_slice(value);
    Some(suffix)
}

/// The client's handshake response without the token: the response as the client would
/// have sent it without attributes. `None` when it does not end with `token` (it is not
/// the guard's client) or is too short to be a response.
pub(super) fn strip_token(response: &[u8], token: &str) -> Option<Vec<u8>> {
    let suffix = token_suffix(token)?;
    if response.len() < RESPONSE_HEADER + suffix.len() || !response.ends_with(&suffix) {
        return None;
    }
    let mut stripped = response[..response.len() - suffix.len()].to_vec();
    let capabilities = u32_at(&stripped, 0)? & !CLIENT_CONNECT_ATTRS;
    stripped[..4].copy_from_slice(&capabilities.to_le_bytes());
    Some(stripped)
}

/// Sets `CLIENT_SSL` in a handshake response (at least [`RESPONSE_HEADER`] bytes, as
/// [`strip_token`] checked): the response a TLS client sends after the handshake.
pub(super) fn with_ssl(response: &[u8]) -> Vec<u8> {
    let mut out = response.to_vec();
    if let Some(capabilities) = u32_at(&out, 0) {
        out[..4].copy_from_slice(&(capabilities | CLIENT_SSL).to_le_bytes());
    }
    out
}

/// The SSLRequest that goes before `response` (with `CLIENT_SSL`, from [`with_ssl`]):
/// its fixed part, as a TLS client sends it.
pub(super) fn ssl_request(response: &[u8]) -> Vec<u8> {
    response[..RESPONSE_HEADER.min(response.len())].to_vec()
}

fn nul_terminated(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// A v10 greeting as MySQL 8 and MariaDB send it.
#[cfg(test)]
pub(super) fn v10(capabilities: u32, plugin: &str) -> Vec<u8> {
    let mut body = vec![10u8];
    body.extend_from_slice(b"8.0.36\0");
    body.extend_from_slice(&7u32.to_le_bytes());
    body.extend_from_slice(b"abcdefgh\0");
    body.extend_from_slice(&(capabilities as u16).to_le_bytes());
    body.push(255);
    body.extend_from_slice(&2u16.to_le_bytes());
    body.extend_from_slice(&((capabilities >> 16) as u16).to_le_bytes());
    body.push(21);
    body.extend_from_slice(&[0; 10]);
    body.extend_from_slice(b"ijklmnopqrst\0");
    body.extend_from_slice(plugin.as_bytes());
    body.push(0);
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_give_capabilities_and_plugin() {
        let caps = 0x0008_8a09;
        assert_eq!(
            greeting(&v10(caps, CACHING_SHA2)),
            Ok(Greeting::V10 {
                capabilities: caps,
                plugin: Some(CACHING_SHA2.into())
            })
        );
        assert_eq!(greeting(&[0xff, 0x10, 0x04]), Ok(Greeting::Error));
        // Cut anywhere, a greeting is refused or read without a plugin, never a panic.
        let whole = v10(caps, "mysql_native_password");
        for end in 0..whole.len() {
            let _ = greeting(&whole[..end]);
        }
        assert!(greeting(&[9, 1, 2]).is_err());
        assert!(greeting(&[]).is_err());
    }

    #[test]
    fn exposing_plugins_are_refused_before_the_client_answers() {
        let switch = |name: &str| {
            let mut p = vec![0xfe];
            p.extend_from_slice(name.as_bytes());
            p.extend_from_slice(b"\0abcdefghijklmnopqrst\0");
            p
        };
        let mut watch = AuthWatch::new(Some("mysql_native_password"));
        assert_eq!(
            watch.server_packet(&switch(CACHING_SHA2)),
            Verdict::Refuse(Exposing::CachingSha2)
        );
        let mut watch = AuthWatch::new(Some("mysql_native_password"));
        assert_eq!(
            watch.server_packet(&switch(CLEAR_PASSWORD)),
            Verdict::Refuse(Exposing::ClearPassword)
        );
        // The greeting's caching_sha2_password: its answer to the scramble.
        for answer in [[0x01, 0x04], [0x01, 0x03]] {
            let mut watch = AuthWatch::new(Some(CACHING_SHA2));
            assert_eq!(
                watch.server_packet(&answer),
                Verdict::Refuse(Exposing::CachingSha2)
            );
        }
        // ... unless the account uses another plugin: the server switches to it.
        let mut watch = AuthWatch::new(Some(CACHING_SHA2));
        assert_eq!(
            watch.server_packet(&switch("mysql_native_password")),
            Verdict::Forward
        );
        assert_eq!(watch.server_packet(&[0x00, 0, 0, 2, 0]), Verdict::Last);
        // A greeting naming another plugin: mysql_async answers with a native scramble,
        // and only a switch can lead it to caching_sha2_password.
        let mut watch = AuthWatch::new(Some("sha256_password"));
        assert_eq!(watch.server_packet(&[0x01, 0x04]), Verdict::Forward);
        // A progress report does not end the watch.
        let mut watch = AuthWatch::new(Some(CACHING_SHA2));
        assert_eq!(
            watch.server_packet(&[0xff, 0xff, 0xff, 1]),
            Verdict::Forward
        );
        assert_eq!(
            watch.server_packet(&[0x01, 0x04]),
            Verdict::Refuse(Exposing::CachingSha2)
        );
    }

    #[test]
    fn mariadb_plugins_pass() {
        let mut watch = AuthWatch::new(Some("mysql_native_password"));
        let mut switch = b"\xfeclient_ed25519\0".to_vec();
        switch.extend_from_slice(&[7; 32]);
        assert_eq!(watch.server_packet(&switch), Verdict::Forward);
        assert_eq!(watch.server_packet(&[0x00, 0, 0]), Verdict::Last);
        let mut watch = AuthWatch::new(Some("mysql_native_password"));
        assert_eq!(watch.server_packet(b"\xfeparsec\0abc"), Verdict::Forward);
        // parsec's salt comes as AuthMoreData.
        assert_eq!(watch.server_packet(b"\x01P\x00salt"), Verdict::Forward);
        assert_eq!(watch.server_packet(&[0xff, 0x15, 0x04]), Verdict::Last);
    }

    #[test]
    fn the_token_is_checked_and_removed() {
        let token = "0123456789abcdef0123456789abcdef";
        let mut response = (CLIENT_CONNECT_ATTRS | 0x0008_8209).to_le_bytes().to_vec();
        response.extend_from_slice(&[0; 28]);
        response.extend_from_slice(b"outboxd\0\x14scramblescramblescram");
        response.extend_from_slice(b"mysql_native_password\0");
        let bare = response.clone();
        response.extend(token_suffix(token).unwrap());
        let stripped = strip_token(&response, token).expect("our client");
        assert_eq!(stripped[4..], bare[4..]);
        assert_eq!(u32_at(&stripped, 0), Some(0x0008_8209));
        assert_eq!(strip_token(&response, &token.replace('0', "1")), None);
        assert_eq!(strip_token(&bare, token), None);
        assert_eq!(strip_token(&response[..20], token), None);
        let tls = with_ssl(&stripped);
        assert_eq!(u32_at(&tls, 0), Some(0x0008_8209 | CLIENT_SSL));
        assert_eq!(ssl_request(&tls), tls[..32]);
    }
}
