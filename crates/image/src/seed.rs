//! A VM's seed: the settings that make one VM of an image its own (host
//! name, root's ssh keys, user accounts), as the text the guest's setup reads from the
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
    /// Accounts the guest makes (`user=`, `user-groups=`, `user-key=`).
    pub users: Vec<SeedUser>,
}

/// An account the guest makes at boot if it has none of that name (home
/// directory, a group of its own, bash, no password: keys only), in the
/// groups named that the image has, with these keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedUser {
    /// The login name.
    pub name: String,
    /// Supplementary groups (`sudo`, `adm`, ...); one the image lacks is
    /// skipped by the guest with a warning on its console.
    pub groups: Vec<String>,
    /// Public keys the account may log in with.
    pub ssh_keys: Vec<String>,
}

impl Seed {
    /// A seed of `hostname`, `ssh_keys` and `users`, each checked: a host
    /// name, public keys of one line each (a configuration file is outside
    /// input as much as a command line: a newline in a key would be a line
    /// of the seed of its own), and account and group names.
    pub fn new(hostname: Option<String>, ssh_keys: Vec<String>, users: Vec<SeedUser>) -> Result<Seed, ImageError> {
        if let Some(name) = &hostname {
            check_hostname(name)?;
        }
        for key in ssh_keys.iter().chain(users.iter().flat_map(|u| &u.ssh_keys)) {
            if !is_public_key(key) || key.contains(['\n', '\r', '\0']) {
                return Err(ImageError::new("reading the ssh keys", format!("{key:?} is not one public key line")));
            }
        }
        for (i, user) in users.iter().enumerate() {
            check_user_name(&user.name)?;
            if user.name == "root" {
                return Err(ImageError::new("reading --user", "root is there already: give its keys with --ssh-key"));
            }
            if users[..i].iter().any(|u| u.name == user.name) {
                return Err(ImageError::new("reading --user", format!("{} is given twice", user.name)));
            }
            for group in &user.groups {
                check_user_name(group)?;
            }
        }
        Ok(Seed { hostname, ssh_keys, users })
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
        for user in &self.users {
            text += &format!("user={}\n", user.name);
            if !user.groups.is_empty() {
                text += &format!("user-groups={} {}\n", user.name, user.groups.join(","));
            }
            for key in &user.ssh_keys {
                text += &format!("user-key={} {key}\n", user.name);
            }
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

/// An account or group name as Debian's `adduser` takes it by default
/// (its NAME_REGEX, without the trailing `$` of machine accounts): a
/// lower-case letter or `_`, then up to 31 lower-case letters, digits, `_`
/// and `-`. Nothing else reaches the guest's `useradd`.
pub fn check_user_name(name: &str) -> Result<(), ImageError> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_lowercase() || b == b'_' || (i > 0 && (b.is_ascii_digit() || b == b'-')));
    if ok {
        Ok(())
    } else {
        Err(ImageError::new(
            "reading --user",
            format!(
                "{name:?} is not a user or group name (a lower-case letter or _, then up to 31 of a-z, 0-9, _ and -)"
            ),
        ))
    }
}

/// `--user NAME[:KEYFILE[:GROUP,...]]`: an account, the public keys in
/// KEYFILE (none if empty) and its groups, checked as [`Seed::new`] does.
pub fn parse_user(spec: &str) -> Result<SeedUser, ImageError> {
    let mut fields = spec.splitn(3, ':');
    let name = fields.next().unwrap_or_default().to_string();
    check_user_name(&name)?;
    let ssh_keys = match fields.next() {
        Some(file) if !file.is_empty() => read_public_keys(&[PathBuf::from(file)])?,
        _ => Vec::new(),
    };
    let groups: Vec<String> = match fields.next() {
        Some(list) => list.split(',').filter(|g| !g.is_empty()).map(str::to_string).collect(),
        None => Vec::new(),
    };
    for g in &groups {
        check_user_name(g)?;
    }
    Ok(SeedUser { name, groups, ssh_keys })
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
        let keys = read_public_keys(std::slice::from_ref(&key)).unwrap();
        let seed = Seed::new(Some("db-1".into()), keys.clone(), Vec::new()).unwrap();
        assert_eq!(seed.text().unwrap(), "hostname=db-1\nssh-key=ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\n");
        let alice = parse_user(&format!("alice:{}:sudo,adm", key.display())).unwrap();
        assert_eq!(alice, SeedUser { name: "alice".into(), groups: vec!["sudo".into(), "adm".into()], ssh_keys: keys });
        let bob = parse_user("bob").unwrap();
        assert_eq!(parse_user("bob::").unwrap(), bob);
        let seed = Seed::new(None, Vec::new(), vec![alice, bob]).unwrap();
        assert_eq!(
            seed.text().unwrap(),
            "user=alice\nuser-groups=alice sudo,adm\nuser-key=alice ssh-ed25519 AAAAC3NzaC1lZDI1NTE5 me@host\nuser=bob\n"
        );
        for bad in ["", "Alice", "1db", "-x", "a b", "a:b", "al\nuser=root", &"a".repeat(33)] {
            assert!(check_user_name(bad).is_err(), "{bad:?} taken as a user name");
        }
        assert!(parse_user("carol:/nonexistent/key.pub").is_err());
        assert!(parse_user("carol::wheel,Bad").is_err());
        let root = SeedUser { name: "root".into(), ..SeedUser::default() };
        assert!(Seed::new(None, Vec::new(), vec![root]).is_err(), "root as a seed user");
        let twice = vec![parse_user("dave").unwrap(), parse_user("dave").unwrap()];
        assert!(Seed::new(None, Vec::new(), twice).is_err(), "a user twice");

        let private = dir.join("id");
        std::fs::write(&private, "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n").unwrap();
        let err = read_public_keys(&[private]).unwrap_err();
        assert!(err.to_string().contains("not a public key"), "{err}");
        for bad in ["", "-db", "db-", "db.example", "db 1", "d\nhostname=x", &"a".repeat(64)] {
            assert!(Seed::new(Some(bad.into()), Vec::new(), Vec::new()).is_err(), "{bad:?} taken as a host name");
        }
        let two_lines = "ssh-ed25519 AAAA a\nhostname=evil".to_string();
        assert!(Seed::new(None, vec![two_lines], Vec::new()).is_err(), "a key of two lines");
        assert!(Seed::new(None, vec!["not a key".into()], Vec::new()).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
