//! The control socket's requests as a person writes them, a line of
//! words (`status`, `snapshot FILE`, `protect --backup HOST:PORT ...`):
//! what `ftvm control SOCKET COMMAND` sends, and what the socket takes
//! from a line that is not JSON (a person at `socat`). `protect` takes
//! `ftvm ft primary`'s pair options, read here without a command-line
//! library: each option is looked up in one table that says which field
//! of [`ProtectConfig`] it fills, and serde checks the values.

use crate::limits::{CPU_LIMIT_PERCENT, TIMEOUT_MS};
use crate::mode::{DiskSharing, EpochProtocol, Mode};
use crate::pair_config::{host_port, ProtectConfig};
use crate::request::{ControlError, Request};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// How much of an unknown command an error quotes.
const QUOTED: usize = 80;

/// A request as a person writes it on the command line: `status`,
/// `pause`, `resume`, `snapshot FILE`, `quit`, `handover`, `protect
/// OPTIONS` (`ftvm ft primary`'s), `unprotect`, `timeout MS`, `cpu-limit
/// PERCENT`, `events`.
pub fn parse(line: &str) -> Result<Request, ControlError> {
    let bad = |m: String| ControlError::BadRequest(m);
    let line = line.trim();
    let quoted: String = line.chars().take(QUOTED).collect();
    let quoted = if quoted.len() < line.len() { format!("{quoted}...") } else { quoted };
    let (word, rest) = line.split_once(' ').map_or((line, ""), |(w, r)| (w, r.trim()));
    match (word, rest) {
        ("status", "") => Ok(Request::Status),
        ("pause", "") => Ok(Request::Pause),
        ("resume", "") => Ok(Request::Resume),
        ("quit", "") => Ok(Request::Quit),
        ("handover", "") => Ok(Request::Handover),
        ("unprotect", "") => Ok(Request::Unprotect),
        ("events", "") => Ok(Request::Events),
        ("protect", rest) => parse_protect(rest)
            .map(|config| Request::Protect(Box::new(config)))
            .map_err(|e| bad(format!("protect: {e}"))),
        ("timeout", ms) => TIMEOUT_MS.parse("timeout", ms).map(|ms| Request::Timeout { ms }).map_err(bad),
        ("cpu-limit", percent) => {
            CPU_LIMIT_PERCENT.parse("cpu-limit", percent).map(|percent| Request::CpuLimit { percent }).map_err(bad)
        }
        ("snapshot", "") | ("snapshot", "--overwrite") => Err(bad("snapshot needs a file name".into())),
        ("snapshot", rest) => Ok(match rest.strip_prefix("--overwrite ") {
            Some(path) => Request::Snapshot { path: PathBuf::from(path.trim()), overwrite: true },
            None => Request::Snapshot { path: PathBuf::from(rest), overwrite: false },
        }),
        _ => Err(bad(format!(
            "unknown command '{quoted}' (status, pause, resume, snapshot [--overwrite] FILE, quit, handover, \
             unprotect, protect --backup HOST:PORT --shared DIR [...], timeout MS, cpu-limit PERCENT, events)"
        ))),
    }
}

/// What an option's value is, and so how it goes into the JSON.
#[derive(Clone, Copy)]
enum Kind {
    /// No value: the field is `true`.
    Flag,
    /// A word, as a JSON string (serde reads a path, a name, a mode).
    Text,
    /// A whole number.
    Number,
    /// HOST:PORT, a host name resolved as the command line resolves it.
    Address,
    /// One of a choice's names, checked by the choice's `FromStr`.
    Choice(fn(&str) -> Result<(), String>),
    /// An IPv4 address, repeatable: the field is a list.
    Ipv4List,
}

/// A choice's check, for [`Kind::Choice`].
fn choice<T: std::str::FromStr<Err = crate::mode::UnknownName>>(name: &str) -> Result<(), String> {
    name.parse::<T>().map(drop).map_err(|e| e.to_string())
}

/// Each option of `protect`: its name, whether it is the pair's (both
/// sides') or the primary's own, its field, and its kind.
const OPTIONS: &[(&str, bool, &str, Kind)] = &[
    ("backup", false, "backup", Kind::Address),
    ("lag-threshold", false, "lag_threshold", Kind::Number),
    ("connect-wait", false, "connect_wait", Kind::Number),
    ("disk-sharing", false, "disk_sharing", Kind::Choice(choice::<DiskSharing>)),
    ("backup-reads", false, "backup_reads", Kind::Flag),
    ("mode", false, "mode", Kind::Choice(choice::<Mode>)),
    ("epoch-length", false, "epoch_length", Kind::Number),
    ("epoch-protocol", false, "epoch_protocol", Kind::Choice(choice::<EpochProtocol>)),
    ("interval", false, "interval", Kind::Number),
    ("no-idle-checkpoints", false, "no_idle_checkpoints", Kind::Flag),
    ("shared", true, "shared", Kind::Text),
    ("etcd", true, "etcd", Kind::Text),
    ("etcd-credentials", true, "etcd_credentials", Kind::Text),
    ("vm-name", true, "vm_name", Kind::Text),
    ("timeout", true, "timeout", Kind::Number),
    ("min-timeout", true, "min_timeout", Kind::Number),
    ("heartbeat-port", true, "heartbeat_port", Kind::Number),
    ("events", true, "events", Kind::Text),
    ("pair-key", true, "pair_key", Kind::Text),
    ("isolation-address", true, "isolation_addresses", Kind::Ipv4List),
    ("isolation-defer", true, "isolation_defer", Kind::Number),
    ("host-id", true, "host_id", Kind::Text),
    ("no-isolation-check", true, "no_isolation_check", Kind::Flag),
];

/// Options that need another, and options that exclude another, as
/// `ftvm ft primary` has them.
const NEEDS: &[(&str, &str)] = &[("etcd", "vm-name"), ("etcd-credentials", "etcd"), ("vm-name", "etcd")];
const EXCLUDES: &[(&str, &str)] = &[("etcd", "shared"), ("no-isolation-check", "isolation-address")];

/// `protect OPTIONS`: the options of `ftvm ft primary` (its pair's, not
/// the VM's), `--name VALUE` or `--name=VALUE`; why not, in one line.
pub fn parse_protect(words: &str) -> Result<ProtectConfig, String> {
    let (mut primary, mut pair) = (Map::new(), Map::new());
    let mut given: Vec<&str> = Vec::new();
    let mut words = words.split_whitespace();
    while let Some(word) = words.next() {
        let Some(option) = word.strip_prefix("--") else {
            return Err(format!("unexpected argument '{word}' (options are --NAME VALUE)"));
        };
        let (name, inline) = option.split_once('=').map_or((option, None), |(n, v)| (n, Some(v)));
        let Some(&(name, of_pair, field, kind)) = OPTIONS.iter().find(|o| o.0 == name) else {
            return Err(format!("unexpected argument '--{name}'"));
        };
        if !matches!(kind, Kind::Ipv4List) && given.contains(&name) {
            return Err(format!("the argument '--{name}' cannot be used multiple times"));
        }
        given.push(name);
        let value = match (kind, inline) {
            (Kind::Flag, None) => Value::Bool(true),
            (Kind::Flag, Some(_)) => return Err(format!("unexpected value for '--{name}', which takes none")),
            (_, Some(v)) => value(name, kind, v)?,
            (_, None) => match words.next() {
                Some(v) if !v.starts_with("--") => value(name, kind, v)?,
                _ => return Err(format!("a value is required for '--{name}' but none was supplied")),
            },
        };
        let fields = if of_pair { &mut pair } else { &mut primary };
        match (kind, fields.get_mut(field)) {
            (Kind::Ipv4List, Some(Value::Array(list))) => list.push(value),
            (Kind::Ipv4List, _) => drop(fields.insert(field.into(), Value::Array(vec![value]))),
            _ => drop(fields.insert(field.into(), value)),
        }
    }
    let has = |name: &str| given.contains(&name);
    if !has("backup") {
        return Err("the following required arguments were not provided: --backup <HOST:PORT>".into());
    }
    if !has("shared") && !has("etcd") {
        return Err("the following required arguments were not provided: --shared <DIR>".into());
    }
    if let Some((a, b)) = NEEDS.iter().find(|(a, b)| has(a) && !has(b)) {
        return Err(format!("the argument '--{a}' requires '--{b}'"));
    }
    if let Some((a, b)) = EXCLUDES.iter().find(|(a, b)| has(a) && has(b)) {
        return Err(format!("the argument '--{a}' cannot be used with '--{b}'"));
    }
    primary.insert("pair".into(), Value::Object(pair));
    let config: ProtectConfig = serde_json::from_value(Value::Object(primary)).map_err(|e| e.to_string())?;
    config.check_mode_options().map_err(|e| e.to_string())?;
    Ok(config)
}

/// An option's value as JSON, by its kind.
fn value(name: &str, kind: Kind, text: &str) -> Result<Value, String> {
    match kind {
        Kind::Number => text
            .parse::<u64>()
            .map(Value::from)
            .map_err(|_| format!("invalid value '{text}' for '--{name}': not a whole number")),
        Kind::Address => host_port(text)
            .map(|a| Value::String(a.to_string()))
            .map_err(|e| format!("invalid value '{text}' for '--{name}': {e}")),
        Kind::Choice(check) => check(text)
            .map(|()| Value::String(text.to_string()))
            .map_err(|e| format!("invalid value '{text}' for '--{name}': {e}")),
        Kind::Ipv4List => text
            .parse::<std::net::Ipv4Addr>()
            .map(|ip| Value::String(ip.to_string()))
            .map_err(|e| format!("invalid value '{text}' for '--{name}': {e}")),
        Kind::Flag | Kind::Text => Ok(Value::String(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `protect`'s words fill the configuration as `ftvm ft primary`'s
    /// options would; what clap refused is refused here, in one line.
    #[test]
    fn protect_words_fill_the_configuration_and_refuse_in_one_line() {
        let words = "--backup 10.0.0.2:7700 --shared /srv/ft --mode=epoch --epoch-length 4096 \
                     --isolation-address 10.0.0.1 --isolation-address 10.0.0.254 --timeout 800 --backup-reads";
        let c = parse_protect(words).unwrap();
        assert_eq!((c.backup, c.mode, c.epoch_length), ("10.0.0.2:7700".parse().unwrap(), Mode::Epoch, Some(4096)));
        assert_eq!(
            c.pair.isolation_addresses,
            ["10.0.0.1".parse::<std::net::Ipv4Addr>().unwrap(), "10.0.0.254".parse().unwrap()]
        );
        assert_eq!((c.pair.timeout, c.backup_reads, c.pair.heartbeat_port), (800, true, 7701));
        for (bad, says) in [
            ("--shared /srv/ft", "--backup"),
            ("--backup 10.0.0.2:7700", "--shared"),
            ("--backup 10.0.0.2:0 --shared /s", "port 0"),
            ("--backup 10.0.0.2:7700 --shared /s --mode remus", "is not a mode"),
            ("--backup 10.0.0.2:7700 --shared /s --timeout 2s", "'--timeout'"),
            ("--backup 10.0.0.2:7700 --shared /s --timeout 1 --timeout 2", "multiple times"),
            ("--backup 10.0.0.2:7700 --shared /s --interval 5", "--interval is for --mode checkpoint"),
            ("--backup 10.0.0.2:7700 --etcd http://e:2379", "requires '--vm-name'"),
            ("--backup 10.0.0.2:7700 --shared /s --etcd http://e --vm-name v", "cannot be used with"),
            ("--backup 10.0.0.2:7700 --shared /s --events", "a value is required"),
            ("--backup 10.0.0.2:7700 --shared /s --backup-reads=yes", "takes none"),
            ("--backup 10.0.0.2:7700 --shared /s extra", "unexpected argument 'extra'"),
            ("--backup 10.0.0.2:7700 --shared /s --help", "unexpected argument '--help'"),
        ] {
            let e = parse_protect(bad).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{bad}: {e}");
        }
    }
}
