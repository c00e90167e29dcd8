//! Secrets of a configuration (passwords, signing secrets): a [`Secret`] never prints its
//! value, and [`resolve`] fills one from the environment or a `*_file` key.
//!
//! The value is reachable only through [`Secret::expose`], so a secret reaches a log line,
//! an error chain or a panic message only where code asks for it by name: `{:?}` of a
//! config struct, `{}` of a field, a `tracing` field all print `***`.
//!
//! A secret file others may read exposes the secret as much as a readable config file:
//! [`read_file`] notes such files, and [`check_file_modes`] hands them to the caller that
//! resolves a configuration's secrets, which warns as it does for the config file.

use std::cell::RefCell;
use std::fmt;
use std::io::Read;
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

/// A secret file whose mode lets users other than outboxd's read it (see
/// [`check_file_modes`]). Holds where the secret is, never the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadableSecretFile {
    /// The file's key, e.g. `source.password_file`.
    pub file_key: String,
    /// The path configured.
    pub path: PathBuf,
    /// The file's mode (permission bits and file type, as `st_mode`).
    pub mode: u32,
}

thread_local! {
    /// The files noted by [`read_file`] while [`check_file_modes`] runs on this thread.
    static READABLE: RefCell<Option<Vec<ReadableSecretFile>>> = const { RefCell::new(None) };
}

/// Runs `resolve`, which reads secret files with [`read_file`], and returns with its result
/// the files it read that users other than outboxd's may read.
///
/// Noted per thread, not returned by `read_file`: every engine's and the inbox's
/// `resolve_secrets` read their files through `read_file`, so each is checked without
/// passing anything back through them, and one added later is checked too. Resolving is
/// synchronous, so the files `resolve` reads are the ones read on this thread meanwhile.
pub fn check_file_modes<T>(resolve: impl FnOnce() -> T) -> (T, Vec<ReadableSecretFile>) {
    /// Puts back the collection of an enclosing call, also when `resolve` panics.
    struct Restore(Option<Vec<ReadableSecretFile>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            READABLE.with(|noted| *noted.borrow_mut() = outer);
        }
    }
    let mut restore = Restore(READABLE.with(|noted| noted.borrow_mut().replace(Vec::new())));
    let result = resolve();
    let found = READABLE
        .with(|noted| noted.borrow_mut().take())
        .unwrap_or_default();
    // An enclosing call sees these files too.
    if let Some(outer) = restore.0.as_mut() {
        outer.extend(found.iter().cloned());
    }
    drop(restore);
    (result, found)
}

/// Notes `file` for [`check_file_modes`] when its mode lets others read it.
fn note_mode(file_key: &str, path: &Path, file: &std::fs::File) {
    let Some(mode) = file.metadata().ok().and_then(|m| readable_by_others(&m)) else {
        return;
    };
    READABLE.with(|noted| {
        if let Some(noted) = noted.borrow_mut().as_mut() {
            noted.push(ReadableSecretFile {
                file_key: file_key.to_owned(),
                path: path.to_path_buf(),
                mode,
            });
        }
    });
}

/// The mode of a file others may read, or `None`.
#[cfg(unix)]
fn readable_by_others(metadata: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mode = metadata.permissions().mode();
    exposed(mode, metadata.uid(), effective_uid()).then_some(mode)
}

#[cfg(not(unix))]
fn readable_by_others(_metadata: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Whether a file of `mode` owned by `owner` lets others read it, for a process running as
/// `euid` (`None`: unknown). World-readable always does. Group-readable does, as for the
/// config file, unless the group is how outboxd itself reads it: a file of another user
/// that outboxd (not root) could read with neither the owner's nor the world's bits. That
/// is how Kubernetes mounts a secret for a pod that runs as a user of its own (owner root,
/// group the pod's fsGroup, mode 0440); `chmod 600` there would lock outboxd out.
#[cfg_attr(not(unix), allow(dead_code))]
fn exposed(mode: u32, owner: u32, euid: Option<u32>) -> bool {
    if mode & 0o004 != 0 {
        return true;
    }
    if mode & 0o040 == 0 {
        return false;
    }
    !matches!(euid, Some(euid) if euid != 0 && euid != owner)
}

/// The effective user id of this process: Linux makes it the owner of `/proc/self` (std
/// has no `geteuid`, and the workspace forbids `unsafe`). `None` without procfs, and then
/// a group-readable file is reported, as for the config file.
#[cfg(unix)]
fn effective_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The secret in file `path`, configured as `file_key`, without its trailing newline
/// (`echo pw > file` and editors add one; a password never ends in one). A file others may
/// read is noted for [`check_file_modes`]; its mode is that of the file opened, whatever
/// the path pointed to (a Kubernetes secret is a symbolic link).
pub fn read_file(file_key: &str, path: &Path) -> Result<Secret, SecretError> {
    let unreadable = |source| SecretError::Unreadable {
        file_key: file_key.to_owned(),
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    note_mode(file_key, path, &file);
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

    #[cfg(unix)]
    #[test]
    fn files_others_may_read_are_noted_while_checking() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "outboxd-secret-mode-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (open, closed) = (dir.join("open"), dir.join("closed"));
        std::fs::write(&open, "pw-open\n").unwrap();
        std::fs::write(&closed, "pw-closed\n").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (values, found) = check_file_modes(|| {
            let a = read_file("a_file", &open).unwrap();
            let b = read_file("b_file", &closed).unwrap();
            (a, b)
        });
        assert_eq!(values.0.expose(), "pw-open");
        assert_eq!(values.1.expose(), "pw-closed");
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].file_key, "a_file");
        assert_eq!(found[0].path, open);
        assert_eq!(found[0].mode & 0o777, 0o644);
        // Nested: the inner call's files reach the outer one too; outside any, nothing
        // is kept.
        let ((), outer) = check_file_modes(|| {
            let ((), inner) = check_file_modes(|| drop(read_file("c_file", &open)));
            assert_eq!(inner.len(), 1);
        });
        assert_eq!(outer.len(), 1);
        read_file("d_file", &open).unwrap();
        assert!(READABLE.with(|noted| noted.borrow().is_none()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_group_bit_outboxd_reads_through_is_not_exposure() {
        // World-readable, whoever owns it.
        assert!(exposed(0o100_644, 1000, Some(1000)));
        assert!(exposed(0o100_604, 0, Some(10001)));
        // Group-readable and outboxd's own: the group bit serves nobody but others.
        assert!(exposed(0o100_640, 1000, Some(1000)));
        assert!(exposed(0o100_440, 0, Some(0)));
        // Unknown user: as for the config file.
        assert!(exposed(0o100_640, 0, None));
        // A Kubernetes secret (root:fsGroup 0440) read by the pod's user: its only way in.
        assert!(!exposed(0o100_440, 0, Some(10001)));
        assert!(!exposed(0o100_600, 1000, Some(1000)));
        assert!(!exposed(0o100_400, 0, Some(10001)));
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
