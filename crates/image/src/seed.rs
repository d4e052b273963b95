//! A VM's seed: the settings that make one VM of an image its own (host
//! name, root's ssh keys), as the text the guest's setup reads from the
//! device tree's `/chosen/ftvm,seed` at boot (`guest/lib/setup`): lines
//! `key=value`. The host side of that protocol, and the reading of the
//! public key files `--ssh-key` names (for a seed and for an image).

use crate::ImageError;
use std::path::PathBuf;

/// The settings of one VM, for its guest's setup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seed {
    /// The VM's host name (`hostname=`).
    pub hostname: Option<String>,
    /// Public keys root may log in with (`ssh-key=`, one each).
    pub ssh_keys: Vec<String>,
}

impl Seed {
    /// A seed of `hostname` and `ssh_keys`, each checked: a host name, and
    /// public keys of one line each (a configuration file is outside input
    /// as much as a command line: a newline in a key would be a line of
    /// the seed of its own).
    pub fn new(hostname: Option<String>, ssh_keys: Vec<String>) -> Result<Seed, ImageError> {
        if let Some(name) = &hostname {
            check_hostname(name)?;
        }
        for key in &ssh_keys {
            if !is_public_key(key) || key.contains(['\n', '\r', '\0']) {
                return Err(ImageError::new("reading the ssh keys", format!("{key:?} is not one public key line")));
            }
        }
        Ok(Seed { hostname, ssh_keys })
    }

    /// The seed's text, `None` when it says nothing (the device tree then
    /// has no seed at all).
    pub fn text(&self) -> Option<String> {
        let mut text = String::new();
        if let Some(name) = &self.hostname {
            text += &format!("hostname={name}\n");
        }
        for key in &self.ssh_keys {
            text += &format!("ssh-key={key}\n");
        }
        (!text.is_empty()).then_some(text)
    }
}

/// A host name as the guest takes it: 1 to 63 letters, digits and `-`
/// (RFC 1123's label), not starting or ending with `-`. One label only:
/// the guest's /etc/hosts maps it, a domain belongs to DNS.
pub fn check_hostname(name: &str) -> Result<(), ImageError> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ImageError::new(
            "reading --hostname",
            format!("{name:?} is not a host name (1 to 63 letters, digits and -, not at either end)"),
        ))
    }
}

/// The public keys in `files` (OpenSSH's `authorized_keys` lines: a
/// `.pub` file, or several keys a file), each checked to be one.
pub fn read_public_keys(files: &[PathBuf]) -> Result<Vec<String>, ImageError> {
    let step = "reading --ssh-key";
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| ImageError::new(step, format!("{}: {e}", f.display())))?;
        let keys: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        if keys.is_empty() {
            return Err(ImageError::new(step, format!("{} holds no key", f.display())));
        }
        for k in keys {
            if !is_public_key(k) {
                return Err(ImageError::new(step, format!("{} is not a public key (give the .pub file)", f.display())));
            }
            out.push(k.to_string());
        }
    }
    Ok(out)
}

/// Whether a line is an `authorized_keys` line: `TYPE BASE64 [COMMENT]`,
/// perhaps after options; a line without a key type is a private key or
/// something else.
fn is_public_key(line: &str) -> bool {
    let known =
        line.split_whitespace().any(|w| w.starts_with("ssh-") || w.starts_with("ecdsa-sha2-") || w.starts_with("sk-"));
    known && !line.contains("PRIVATE KEY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_lines_of_what_is_given() {
        assert_eq!(Seed::default().text(), None);
        let dir = std::env::temp_dir().join(format!("ftvm-seed-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("id.pub");
        std::fs::write(&key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\n\n# a comment\n").unwrap();
        let seed = Seed::new(Some("db-1".into()), read_public_keys(std::slice::from_ref(&key)).unwrap()).unwrap();
        assert_eq!(seed.text().unwrap(), "hostname=db-1\nssh-key=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\n");

        let private = dir.join("id");
        std::fs::write(&private, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n").unwrap();
        let err = read_public_keys(&[private]).unwrap_err();
        assert!(err.to_string().contains("not a public key"), "{err}");
        for bad in ["", "-db", "db-", "db.example", "db 1", "d\nhostname=x", &"a".repeat(64)] {
            assert!(Seed::new(Some(bad.into()), Vec::new()).is_err(), "{bad:?} taken as a host name");
        }
        let two_lines = "ssh-ed25519 AAAA a\nhostname=evil".to_string();
        assert!(Seed::new(None, vec![two_lines]).is_err(), "a key of two lines");
        assert!(Seed::new(None, vec!["not a key".into()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
