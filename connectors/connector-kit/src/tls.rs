//! TLS of an engine's `[source]`: the `sslmode` key and its certificate files, with
//! libpq's meaning, shared by every engine.
//!
//! An engine reads its `sslmode`, `sslrootcert`, `sslcert` and `sslkey` keys into
//! [`TlsOptions`] and turns them into a [`TlsPolicy`] once, when the connector is built:
//! what to ask of the server (TLS off, if offered, required), what to verify (nothing, the
//! chain, the chain and the host name), which roots to trust, and the client certificate.
//! Bad combinations and unreadable files are definite errors then, naming the key to
//! change, so that `run` never starts with a TLS setting it cannot honour. The engine's
//! own TLS library does the handshake; [`Negotiated`] is what it reports back, and
//! [`tls_line`] is the `outboxd check` line made of it.

use std::path::{Path, PathBuf};

use outboxd_connector::{CheckLine, ConnectorError};
use serde::Deserialize;

/// How to use TLS on the SQL and log connections: libpq's `sslmode`. Config key
/// `sslmode`, for every engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain TCP otherwise. The certificate is not
    /// verified, unless `sslrootcert` is set (then its chain is, as in libpq).
    #[default]
    Prefer,
    /// TLS or fail; the certificate is not verified, unless `sslrootcert` is set (then
    /// this is `verify-ca`, as in libpq).
    Require,
    /// TLS or fail; the certificate chain is verified against `sslrootcert`; the host
    /// name is not checked.
    VerifyCa,
    /// TLS or fail; the certificate chain is verified (against `sslrootcert`, or the
    /// system's trusted roots when it is not set) and the certificate must name the host
    /// connected to (DNS name or IP address in its subject alternative names).
    VerifyFull,
}

impl SslMode {
    /// The value as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TLS keys of a `[source]`, as configured.
#[derive(Clone, Copy, Debug)]
pub struct TlsOptions<'a> {
    /// `sslmode`.
    pub mode: SslMode,
    /// `sslrootcert`: PEM file of the CA certificate(s) to trust.
    pub rootcert: Option<&'a Path>,
    /// `sslcert`: PEM file of the client certificate (with its chain, if any).
    pub cert: Option<&'a Path>,
    /// `sslkey`: PEM file of the client certificate's private key.
    pub key: Option<&'a Path>,
}

/// Whether TLS is used at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsUse {
    /// Plain TCP (`disable`).
    Off,
    /// TLS when the server offers it (`prefer`).
    IfOffered,
    /// TLS or no connection (`require` and the `verify-*` modes).
    Required,
}

/// What is verified of the server's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verification {
    /// Nothing: the channel is encrypted, but anyone on the path can pose as the server.
    None,
    /// The chain up to a trusted root; any host name is accepted.
    Chain,
    /// The chain and the host name (or IP address) connected to.
    ChainAndHost,
}

/// Which roots a verified chain must end in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Roots {
    /// The system's trusted roots (OpenSSL's default verify paths), as libpq's
    /// `sslrootcert=system`. Only with `verify-full`.
    System,
    /// The certificates of this PEM file, and only those.
    File(PathBuf),
}

/// The files of a client certificate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientCert {
    /// `sslcert`.
    pub cert: PathBuf,
    /// `sslkey`.
    pub key: PathBuf,
}

/// What an engine does about TLS on each of its connections, from [`TlsOptions`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsPolicy {
    /// `sslmode` as configured (for messages).
    pub mode: SslMode,
    /// Whether to use TLS.
    pub tls: TlsUse,
    /// What to verify when TLS is used.
    pub verify: Verification,
    /// The roots to verify against (meaningful when `verify` is not `None`).
    pub roots: Roots,
    /// The client certificate to present, if any.
    pub client: Option<ClientCert>,
}

impl TlsPolicy {
    /// The policy of `options`; checks that the files named exist and can be read. Errors
    /// are definite and name the key to change.
    pub fn from_options(options: TlsOptions<'_>) -> Result<Self, ConnectorError> {
        let mode = options.mode;
        let root_file = match options.rootcert {
            Some(path) => {
                readable("source.sslrootcert", path)?;
                Some(path.to_path_buf())
            }
            None => None,
        };
        let client = match (options.cert, options.key) {
            (Some(cert), Some(key)) => {
                readable("source.sslcert", cert)?;
                readable("source.sslkey", key)?;
                Some(ClientCert {
                    cert: cert.to_path_buf(),
                    key: key.to_path_buf(),
                })
            }
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConnectorError::definite(
                    "source.sslcert is set without source.sslkey: set both (the client \
                     certificate and its private key, PEM files) or neither",
                ))
            }
            (None, Some(_)) => {
                return Err(ConnectorError::definite(
                    "source.sslkey is set without source.sslcert: set both (the client \
                     certificate and its private key, PEM files) or neither",
                ))
            }
        };
        let (tls, verify) = match mode {
            SslMode::Disable => (TlsUse::Off, Verification::None),
            // libpq verifies the chain whenever a root certificate is given, in these
            // modes too: `require` with `sslrootcert` is `verify-ca`.
            SslMode::Prefer if root_file.is_some() => (TlsUse::IfOffered, Verification::Chain),
            SslMode::Prefer => (TlsUse::IfOffered, Verification::None),
            SslMode::Require if root_file.is_some() => (TlsUse::Required, Verification::Chain),
            SslMode::Require => (TlsUse::Required, Verification::None),
            SslMode::VerifyCa => (TlsUse::Required, Verification::Chain),
            SslMode::VerifyFull => (TlsUse::Required, Verification::ChainAndHost),
        };
        let roots = match root_file {
            Some(path) => Roots::File(path),
            // Any certificate a public CA issued, for any name, would pass a chain-only
            // check against the system's roots: libpq refuses `sslrootcert=system` with
            // `verify-ca` for that reason, and so do we.
            None if mode == SslMode::VerifyCa => {
                return Err(ConnectorError::definite(
                    "source.sslmode = \"verify-ca\" needs source.sslrootcert (the PEM file of \
                     the CA that signed the server's certificate); against the system's roots \
                     without a host name check any publicly issued certificate would pass. Set \
                     source.sslrootcert, or use sslmode = \"verify-full\" to verify against \
                     the system's roots",
                ))
            }
            None => Roots::System,
        };
        Ok(Self {
            mode,
            tls,
            verify,
            roots,
            client,
        })
    }

    /// True when a server that answers without TLS must be refused.
    pub fn tls_required(&self) -> bool {
        self.tls == TlsUse::Required
    }

    /// The error for a server that does not offer TLS when [`Self::tls_required`]:
    /// definite (a downgrade is refused, never retried into).
    pub fn downgrade_refused(&self, context: &str) -> ConnectorError {
        ConnectorError::definite(format!(
            "{context}: the server does not offer TLS and source.sslmode is `{}`: refusing \
             to connect without it (enable TLS on the server; only sslmode = \"prefer\" or \
             \"disable\" connect without TLS)",
            self.mode
        ))
    }

    /// The error for a certificate that failed verification: definite, naming the keys.
    pub fn verification_failed(&self, context: &str, cause: &str) -> ConnectorError {
        let roots = match &self.roots {
            Roots::File(path) => format!("the CA(s) of source.sslrootcert `{}`", path.display()),
            Roots::System => "the system's trusted roots".to_owned(),
        };
        let what = match self.verify {
            Verification::ChainAndHost => "certificate chain and host name",
            _ => "certificate chain",
        };
        ConnectorError::definite(format!(
            "{context}: the server's {what} could not be verified against {roots} \
             (source.sslmode `{}`): {cause}. Point source.sslrootcert at the CA that signed \
             the server's certificate, and source.host at a name the certificate holds",
            self.mode
        ))
    }
}

/// Checks that `path` (the value of config key `key`) is a readable file.
fn readable(key: &str, path: &Path) -> Result<(), ConnectorError> {
    match std::fs::File::open(path) {
        Ok(file) => match file.metadata() {
            Ok(meta) if meta.is_file() => Ok(()),
            Ok(_) => Err(ConnectorError::definite(format!(
                "{key} = `{}` is not a file: set {key} to a PEM file",
                path.display()
            ))),
            Err(e) => Err(unreadable(key, path, &e)),
        },
        Err(e) => Err(unreadable(key, path, &e)),
    }
}

fn unreadable(key: &str, path: &Path, e: &std::io::Error) -> ConnectorError {
    ConnectorError::definite(format!(
        "{key} = `{}` cannot be read: {e}; set {key} to a PEM file outboxd may read",
        path.display()
    ))
}

/// Reads the file of config key `key`, with an error naming key and path.
pub fn read_file(key: &str, path: &Path) -> Result<Vec<u8>, ConnectorError> {
    std::fs::read(path).map_err(|e| unreadable(key, path, &e))
}

/// The error for a file that was read but does not hold what `key` needs.
pub fn bad_file(
    key: &str,
    path: &Path,
    what: &str,
    cause: impl std::fmt::Display,
) -> ConnectorError {
    ConnectorError::definite(format!(
        "{key} = `{}` does not hold {what} in PEM form: {cause}",
        path.display()
    ))
}

/// The CA certificates of `source.sslrootcert` (PEM), at least one.
pub fn root_certificates(path: &Path) -> Result<Vec<openssl::x509::X509>, ConnectorError> {
    const KEY: &str = "source.sslrootcert";
    let pem = read_file(KEY, path)?;
    let certs = openssl::x509::X509::stack_from_pem(&pem)
        .map_err(|e| bad_file(KEY, path, "CA certificates", e))?;
    if certs.is_empty() {
        return Err(bad_file(
            KEY,
            path,
            "CA certificates",
            "no certificate found",
        ));
    }
    Ok(certs)
}

/// A client certificate (`source.sslcert`: the certificate, then any intermediates) and
/// its key (`source.sslkey`), checked to belong together.
pub struct ClientIdentity {
    /// The client's own certificate.
    pub leaf: openssl::x509::X509,
    /// Intermediate certificates sent with it.
    pub chain: Vec<openssl::x509::X509>,
    /// The unencrypted private key of `leaf`.
    pub key: openssl::pkey::PKey<openssl::pkey::Private>,
}

impl ClientIdentity {
    /// Reads and checks the files of `client`. The key is compared with the certificate
    /// here, because the TLS library's own refusal would not say which keys to change.
    pub fn load(client: &ClientCert) -> Result<Self, ConnectorError> {
        let pem = read_file("source.sslcert", &client.cert)?;
        let mut certs = openssl::x509::X509::stack_from_pem(&pem)
            .map_err(|e| bad_file("source.sslcert", &client.cert, "a certificate", e))?
            .into_iter();
        let leaf = certs.next().ok_or_else(|| {
            bad_file(
                "source.sslcert",
                &client.cert,
                "a certificate",
                "no certificate found",
            )
        })?;
        let pem = read_file("source.sslkey", &client.key)?;
        let key = openssl::pkey::PKey::private_key_from_pem(&pem).map_err(|e| {
            bad_file(
                "source.sslkey",
                &client.key,
                "an unencrypted private key",
                e,
            )
        })?;
        let mismatch = || {
            ConnectorError::definite(format!(
                "source.sslkey `{}` is not the key of source.sslcert `{}`",
                client.key.display(),
                client.cert.display()
            ))
        };
        let public = leaf.public_key().map_err(|_| mismatch())?;
        if !public.public_eq(&key) {
            return Err(mismatch());
        }
        Ok(Self {
            leaf,
            chain: certs.collect(),
            key,
        })
    }
}

/// What one connection ended up with, as the engine's TLS library reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Negotiated {
    /// Plain TCP.
    Plain,
    /// TLS.
    Tls {
        /// Protocol version as the library names it (`TLSv1.3`).
        version: String,
        /// What was verified of the certificate (the handshake failed otherwise).
        verified: Verification,
    },
}

/// `TLSv1.3` → `TLS 1.3`.
fn version_text(version: &str) -> String {
    match version.strip_prefix("TLSv") {
        Some(number) => format!("TLS {number}"),
        None => version.to_owned(),
    }
}

/// The `outboxd check` line `item` for a connection to `host` under `policy` that
/// negotiated `negotiated`: OK when the certificate was verified, WARN (with the fix)
/// otherwise.
pub fn tls_line(item: &str, host: &str, policy: &TlsPolicy, negotiated: &Negotiated) -> CheckLine {
    const FIX: &str = "set source.sslmode = \"verify-full\" and source.sslrootcert = <the PEM \
                       file of the CA that signed the server's certificate>";
    let mode = policy.mode;
    let client = if policy.client.is_some() {
        ", client certificate presented"
    } else {
        ""
    };
    match negotiated {
        Negotiated::Plain => CheckLine::warn(
            item,
            format!("no TLS (sslmode={mode}): the password and every change travel in the clear"),
            FIX,
        ),
        Negotiated::Tls { version, verified } => {
            let version = version_text(version);
            match verified {
                Verification::ChainAndHost => CheckLine::ok(
                    item,
                    format!("{version}, certificate verified for {host} (sslmode={mode}{client})"),
                ),
                Verification::Chain => CheckLine::ok(
                    item,
                    format!(
                        "{version}, certificate chain verified, host name not checked \
                         (sslmode={mode}{client})"
                    ),
                ),
                Verification::None => CheckLine::warn(
                    item,
                    format!("{version}, certificate NOT verified (sslmode={mode}{client})"),
                    FIX,
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxd_connector::CheckStatus;

    fn options(mode: SslMode, rootcert: Option<&Path>) -> TlsOptions<'_> {
        TlsOptions {
            mode,
            rootcert,
            cert: None,
            key: None,
        }
    }

    #[test]
    fn modes_follow_libpq() {
        // Any readable file does: the policy only checks that it can be read.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tls.rs");
        let p = |mode, rootcert| TlsPolicy::from_options(options(mode, rootcert)).unwrap();
        assert_eq!(p(SslMode::Disable, None).tls, TlsUse::Off);
        assert_eq!(p(SslMode::Prefer, None).verify, Verification::None);
        assert_eq!(p(SslMode::Require, None).verify, Verification::None);
        let require_with_root = p(SslMode::Require, Some(&root));
        assert_eq!(require_with_root.verify, Verification::Chain);
        assert_eq!(require_with_root.roots, Roots::File(root.clone()));
        assert_eq!(p(SslMode::Prefer, Some(&root)).verify, Verification::Chain);
        assert_eq!(
            p(SslMode::VerifyCa, Some(&root)).verify,
            Verification::Chain
        );
        let full = p(SslMode::VerifyFull, None);
        assert_eq!(
            (full.verify, full.roots, full.tls),
            (Verification::ChainAndHost, Roots::System, TlsUse::Required)
        );
        let err = TlsPolicy::from_options(options(SslMode::VerifyCa, None)).unwrap_err();
        assert!(err.message().contains("source.sslrootcert"), "{err}");
    }

    #[test]
    fn unreadable_files_name_their_key() {
        let missing = Path::new("/nonexistent/outboxd-ca.pem");
        let err = TlsPolicy::from_options(options(SslMode::VerifyFull, Some(missing))).unwrap_err();
        assert!(err.message().contains("source.sslrootcert"), "{err}");
        assert!(
            err.message().contains("/nonexistent/outboxd-ca.pem"),
            "{err}"
        );
        let err = TlsPolicy::from_options(TlsOptions {
            mode: SslMode::Require,
            rootcert: None,
            cert: Some(missing),
            key: None,
        })
        .unwrap_err();
        assert!(err.message().contains("source.sslkey"), "{err}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let err = TlsPolicy::from_options(TlsOptions {
            mode: SslMode::Require,
            rootcert: None,
            cert: Some(dir),
            key: Some(dir),
        })
        .unwrap_err();
        assert!(err.message().contains("source.sslcert"), "{err}");
    }

    #[test]
    fn check_lines_say_what_was_verified() {
        let policy = TlsPolicy::from_options(options(SslMode::VerifyFull, None)).unwrap();
        let tls = |verified| Negotiated::Tls {
            version: "TLSv1.3".into(),
            verified,
        };
        let line = tls_line(
            "tls",
            "127.0.0.1",
            &policy,
            &tls(Verification::ChainAndHost),
        );
        assert_eq!(line.status, CheckStatus::Ok);
        assert_eq!(
            line.detail,
            "TLS 1.3, certificate verified for 127.0.0.1 (sslmode=verify-full)"
        );
        let require = TlsPolicy::from_options(options(SslMode::Require, None)).unwrap();
        let line = tls_line("tls", "db", &require, &tls(Verification::None));
        assert_eq!(line.status, CheckStatus::Warn);
        assert_eq!(
            line.detail,
            "TLS 1.3, certificate NOT verified (sslmode=require)"
        );
        let line = tls_line("tls", "db", &require, &Negotiated::Plain);
        assert!(line.detail.starts_with("no TLS"), "{}", line.detail);
    }
}
