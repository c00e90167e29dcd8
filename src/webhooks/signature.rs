//! Standard Webhooks signatures: `webhook-signature` carries `v1,<base64>` entries, each
//! an HMAC-SHA256 over `<webhook-id>.<webhook-timestamp>.<body>` with the source's
//! secret. Several secrets may be configured at once (rotation); a request passes when
//! any entry matches any secret. Comparison is constant-time.
//!
//! Our own code rather than the `standardwebhooks` crate: that verifier (one per secret)
//! signs once and compares every entry the header lists; ours also bounds the entries
//! looked at and skips malformed ones before any work (see [`verify`]), checks all of a
//! source's secrets in one pass, and needs nothing beyond `hmac` and `sha2`, which outboxd
//! already uses. Both follow the same specification: signatures made by any Standard
//! Webhooks library verify here (`sign` is checked against the specification's example).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// A signing secret: `whsec_<base64>` as Standard Webhooks writes it, or raw text.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    /// Parses a configured secret.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let key = match text.strip_prefix("whsec_") {
            Some(b64) => STANDARD
                .decode(b64)
                .map_err(|e| format!("a whsec_ secret must be base64 after the prefix: {e}"))?,
            None => text.as_bytes().to_vec(),
        };
        if key.len() < 16 {
            return Err("a signing secret needs at least 16 bytes".into());
        }
        Ok(Self(key))
    }
}

/// Why a request's signature is refused (answered 401).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SignatureError {
    /// A header is missing.
    #[error("missing {0} header (this source requires Standard Webhooks signatures)")]
    Missing(&'static str),
    /// The timestamp is not whole seconds.
    #[error("webhook-timestamp is not a Unix time in seconds")]
    BadTimestamp,
    /// The timestamp is outside the tolerance.
    #[error("webhook-timestamp is {0} s away from now, beyond the tolerance")]
    Stale(u64),
    /// No entry matches any secret.
    #[error("no webhook-signature entry matches this source's secrets")]
    Mismatch,
}

/// Entries of `webhook-signature` looked at, at most: a sender lists one per secret it
/// signs with (two or three while rotating); the rest of a longer list costs nothing.
pub(crate) const MAX_SIGNATURE_ENTRIES: usize = 8;
/// Length of a `v1` entry's base64 text: an HMAC-SHA256 tag is 32 bytes, 44 characters.
/// An entry of any other length cannot match and is skipped without being decoded.
const TAG_BASE64_LEN: usize = 44;

/// Checks a request's signature headers against `secrets`.
///
/// Cost is bounded whatever the request holds: the timestamp is checked first (no MAC for
/// a stale request), at most [`MAX_SIGNATURE_ENTRIES`] entries are looked at, only those
/// that decode to 32 bytes are kept, and the MAC over the body is computed once per
/// secret (none when no entry could match), then compared with each entry in constant
/// time.
pub(crate) fn verify(
    secrets: &[Secret],
    id: Option<&str>,
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    tolerance: Duration,
    now: SystemTime,
) -> Result<(), SignatureError> {
    let id = id.ok_or(SignatureError::Missing("webhook-id"))?;
    let timestamp = timestamp.ok_or(SignatureError::Missing("webhook-timestamp"))?;
    let signature = signature.ok_or(SignatureError::Missing("webhook-signature"))?;
    let seconds: u64 = timestamp
        .trim()
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let skew = now.abs_diff(seconds);
    if skew > tolerance.as_secs() {
        return Err(SignatureError::Stale(skew));
    }
    let candidates: Vec<Vec<u8>> = signature
        .split_ascii_whitespace()
        .take(MAX_SIGNATURE_ENTRIES)
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter(|b64| b64.len() == TAG_BASE64_LEN)
        .filter_map(|b64| STANDARD.decode(b64).ok())
        .filter(|tag| tag.len() == 32)
        .collect();
    if candidates.is_empty() {
        return Err(SignatureError::Mismatch);
    }
    for secret in secrets {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&secret.0) else {
            continue;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        // Every entry is compared (no early exit), each in constant time.
        let matched = candidates.iter().fold(false, |found, candidate| {
            found | same_bytes(candidate, &tag)
        });
        if matched {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

/// Equal, in time that depends on the length only.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// `v1,<base64>` for `body`, as a sender signs it (tests, and the demo's sender).
pub fn sign(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Result<String, String> {
    Ok(Secret::parse(secret)?.sign(id, timestamp, body))
}

impl Secret {
    /// This secret's `v1,<base64>` entry for a message: the HMAC-SHA256 of
    /// `<id>.<timestamp>.<body>`.
    pub(crate) fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        // An HMAC takes a key of any length: this cannot fail.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts any key");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header for a message: one entry per secret (several while the
/// receiver rotates), separated by spaces.
pub(crate) fn signature_header(
    secrets: &[Secret],
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> String {
    let entries: Vec<String> = (secrets.iter())
        .map(|secret| secret.sign(id, timestamp, body))
        .collect();
    entries.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn a_signed_request_passes_with_any_current_secret() {
        let old = Secret::parse("whsec_b2xkLXNlY3JldC1vbGQtc2VjcmV0").unwrap();
        let current = Secret::parse(SECRET).unwrap();
        let sig = sign(SECRET, "msg_1", 1_700_000_000, b"{\"a\":1}").unwrap();
        // Several entries, the matching one last, as during a sender's rotation.
        let header = format!("v1,AAAA v1,bm9wZQ== {sig}");
        let tolerance = Duration::from_secs(300);
        let ok = verify(
            &[old, current],
            Some("msg_1"),
            Some("1700000000"),
            Some(&header),
            b"{\"a\":1}",
            tolerance,
            at(1_700_000_100),
        );
        assert_eq!(ok, Ok(()));
    }

    /// The example of the Standard Webhooks specification signs and verifies as it says.
    #[test]
    fn the_specification_example_verifies() {
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body).unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let ok = verify(
            &[Secret::parse(SECRET).unwrap()],
            Some("msg_p5jXN8AQM9LWM0D4loKWxJek"),
            Some("1614265330"),
            Some(&sig),
            body,
            Duration::from_secs(300),
            at(1_614_265_330),
        );
        assert_eq!(ok, Ok(()));
    }

    /// Only the first [`MAX_SIGNATURE_ENTRIES`] entries count: a request padded with
    /// hundreds of entries gets no more work than that, and a genuine entry hidden behind
    /// them is not found.
    #[test]
    fn only_the_first_entries_are_looked_at() {
        let secrets = [Secret::parse(SECRET).unwrap()];
        let sig = sign(SECRET, "msg_1", 1_700_000_000, b"body").unwrap();
        let check = |header: &str| {
            verify(
                &secrets,
                Some("msg_1"),
                Some("1700000000"),
                Some(header),
                b"body",
                Duration::from_secs(300),
                at(1_700_000_000),
            )
        };
        let padding = |n: usize| vec!["v1,"; n].join(" ");
        let last_counted = format!("{} {sig}", padding(MAX_SIGNATURE_ENTRIES - 1));
        assert_eq!(check(&last_counted), Ok(()));
        let past_the_bound = format!("{} {sig}", padding(MAX_SIGNATURE_ENTRIES));
        assert_eq!(check(&past_the_bound), Err(SignatureError::Mismatch));
        let flood = format!("{sig} {}", padding(1_500));
        assert_eq!(check(&flood), Ok(()), "a genuine first entry still passes");
        // Entries that cannot be a 32-byte tag are skipped (short, long, not base64).
        let odd = format!("v1,AAAA v1,{} v1,{} {sig}", "A".repeat(88), "!".repeat(44));
        assert_eq!(check(&odd), Ok(()));
        assert_eq!(check(&padding(1_500)), Err(SignatureError::Mismatch));
    }

    #[test]
    fn tampering_staleness_and_missing_headers_are_refused() {
        let secrets = [Secret::parse(SECRET).unwrap()];
        let sig = sign(SECRET, "msg_1", 1_700_000_000, b"body").unwrap();
        let t = Duration::from_secs(300);
        let check = |id, ts, sig: Option<&str>, body: &[u8], now| {
            verify(&secrets, id, ts, sig, body, t, at(now))
        };
        let now = 1_700_000_000;
        assert_eq!(
            check(Some("msg_1"), Some("1700000000"), Some(&sig), b"bodY", now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            check(Some("msg_2"), Some("1700000000"), Some(&sig), b"body", now),
            Err(SignatureError::Mismatch),
            "the id is signed"
        );
        assert_eq!(
            check(
                Some("msg_1"),
                Some("1700000000"),
                Some(&sig),
                b"body",
                now + 301
            ),
            Err(SignatureError::Stale(301))
        );
        assert_eq!(
            check(Some("msg_1"), Some("soon"), Some(&sig), b"body", now),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            check(Some("msg_1"), Some("1700000000"), None, b"body", now),
            Err(SignatureError::Missing("webhook-signature"))
        );
        assert!(Secret::parse("whsec_!!").is_err());
        assert!(Secret::parse("short").is_err());
    }
}
