//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API): the
//! config loader and the inbox's HTTP request handling, fed arbitrary bytes. Errors are
//! ignored; a panic is a bug.

use std::time::{Duration, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::Config;
use crate::inbox::http::{checked_headers, to_message};
use crate::inbox::signature::Secret;

/// The signing secret of the source `signed` (the seeds are signed with it).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The clock of [`inbox_http`]: seeds' `webhook-timestamp` is this.
pub const NOW: u64 = 1_700_000_000;

/// `config_loader`: TOML text through what `Config::load` does with a file's text
/// (parse, with errors that must not quote secrets; the inline-secret scan; validation
/// with every bound), minus reading files and the environment.
pub fn config_loader(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(table) = text.parse::<toml::Table>() {
        let _ = crate::secrets::inline_secrets(&table);
    }
    match Config::parse(text) {
        Ok(config) => {
            let _ = config.validate();
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// `inbox_http`: a request to `POST /v1/inbox/{source}` as the handler sees it, in the
/// form `source\nname: value\n…\n\nbody` (header lines hyper would refuse are dropped).
/// The headers are checked (the signature too, when the source is `signed`, against
/// [`SECRET`] at [`NOW`]) and the body becomes the stored message, for a text and a JSON
/// payload column alike.
pub fn inbox_http(data: &[u8]) {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|b| *b == b'\n');
    let source = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    let _ = Secret::parse(&source);
    let secrets = [Secret::parse(SECRET).unwrap_or_else(|e| panic!("{e}"))];
    let signed = (source == "signed").then_some(&secrets[..]);
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let tolerance = Duration::from_secs(300);
    if let Ok(fields) = checked_headers(&headers, body, signed, tolerance, now) {
        let _ = to_message(source.clone(), fields.clone(), &headers, body, false);
        let _ = to_message(source, fields, &headers, body, true);
    }
}
