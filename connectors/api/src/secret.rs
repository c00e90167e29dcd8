//! Secrets of a configuration (passwords, signing secrets): a [`Secret`] never prints its
//! value, and [`resolve`] fills one from the environment or a `*_file` key.
//!
//! The value is reachable only through [`Secret::expose`], so a secret reaches a log line,
//! an error chain or a panic message only where code asks for it by name: `{:?}` of a
//! config struct, `{}` of a field, a `tracing` field all print `***`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A secret value. `Debug` and `Display` print `***`; [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that sends it (a login, a signature key).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// A secret that cannot be resolved. Never holds the secret itself.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Both the value and its file are configured: which one wins would be a guess.
    #[error(
        "{key} and {file_key} are both set: keep one (the file keeps the secret out of the config)"
    )]
    Both {
        /// The value's key, e.g. `source.password`.
        key: String,
        /// The file's key, e.g. `source.password_file`.
        file_key: String,
    },
    /// The file cannot be read.
    #[error("{file_key}: cannot read {}: {source}", path.display())]
    Unreadable {
        /// The file's key.
        file_key: String,
        /// The path configured.
        path: PathBuf,
        /// The I/O error (its text never contains the file's content).
        source: std::io::Error,
    },
    /// The file is empty (or holds only a newline).
    #[error("{file_key}: {} is empty", path.display())]
    Empty {
        /// The file's key.
        file_key: String,
        /// The path configured.
        path: PathBuf,
    },
}

/// The secret in file `path`, configured as `file_key`, without its trailing newline
/// (`echo pw > file` and editors add one; a password never ends in one).
pub fn read_file(file_key: &str, path: &Path) -> Result<Secret, SecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretError::Unreadable {
        file_key: file_key.to_owned(),
        path: path.to_path_buf(),
        source,
    })?;
    let value = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(SecretError::Empty {
            file_key: file_key.to_owned(),
            path: path.to_path_buf(),
        });
    }
    Ok(Secret::new(value))
}

/// Resolves one secret configured as `key` (the value, in `value`) or `file_key` (a file,
/// in `file`), overridden by the environment: `env`, when set, wins and the file is not
/// read. Both `key` and `file_key` set is an error even then, so a config that is wrong on
/// its own is never accepted.
pub fn resolve(
    key: &str,
    file_key: &str,
    value: &mut Option<Secret>,
    file: Option<&Path>,
    env: Option<String>,
) -> Result<(), SecretError> {
    if value.is_some() && file.is_some() {
        return Err(SecretError::Both {
            key: key.to_owned(),
            file_key: file_key.to_owned(),
        });
    }
    if let Some(from_env) = env {
        *value = Some(Secret::new(from_env));
    } else if let Some(path) = file {
        *value = Some(read_file(file_key, path)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret:?} {secret}"), "*** ***");
        assert_eq!(format!("{:?}", Some(&secret)), "Some(***)");
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn files_lose_one_trailing_newline_and_errors_name_key_and_path() {
        let dir = std::env::temp_dir().join(format!("outboxd-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pw");
        for (content, expected) in [
            ("pw1\n", "pw1"),
            ("pw2\r\n", "pw2"),
            ("pw3", "pw3"),
            (" a b \n\n", " a b \n"),
        ] {
            std::fs::write(&path, content).unwrap();
            assert_eq!(read_file("k_file", &path).unwrap().expose(), expected);
        }
        std::fs::write(&path, "\n").unwrap();
        let err = read_file("k_file", &path).unwrap_err().to_string();
        assert!(err.contains("k_file") && err.contains("empty"), "{err}");
        let missing = dir.join("missing");
        let err = read_file("source.password_file", &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("source.password_file"), "{err}");
        assert!(err.contains(&missing.display().to_string()), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn value_and_file_conflict_and_the_environment_wins() {
        let file = Path::new("/nonexistent/outboxd-pw");
        let mut value = Some(Secret::new("inline"));
        let err = resolve(
            "a.password",
            "a.password_file",
            &mut value,
            Some(file),
            None,
        );
        let err = err.unwrap_err().to_string();
        assert!(
            err.contains("a.password") && err.contains("a.password_file"),
            "{err}"
        );
        assert!(!err.contains("inline"), "{err}");

        let mut value = Some(Secret::new("inline"));
        resolve("k", "k_file", &mut value, None, Some("env".into())).unwrap();
        assert_eq!(value.unwrap().expose(), "env");
        // The environment wins over a file, which is then not read.
        let mut value = None;
        resolve("k", "k_file", &mut value, Some(file), Some("env".into())).unwrap();
        assert_eq!(value.unwrap().expose(), "env");
        let mut value = None;
        assert!(resolve("k", "k_file", &mut value, Some(file), None).is_err());
    }
}
