//! Split-brain protection (VMware FT §2.3): before a primary or a backup
//! goes live alone it must win an atomic test-and-set on the shared
//! storage. The storage is a directory both hosts reach (NFS, a cluster
//! file system, or on one machine a plain directory); the test-and-set is
//! the exclusive creation of one file per protected pair's *generation*,
//! which POSIX makes atomic (`O_CREAT | O_EXCL`, also over NFSv3 and
//! later). The winner writes its name into the file; the loser reads it.
//!
//! Each start of protection claims a fresh generation number (files
//! `gen-N.pair`), so the `.live` file of an old failover never decides a
//! new one. The `.pair` file holds a random *storage token* the primary
//! also sends its backup: a backup that reads another token (or none)
//! through its own path to the storage does not see the primary's
//! storage, the test-and-set would not be one, and it refuses to follow
//! ([`Arbiter::check_storage`]).
//! While the directory cannot be reached the caller waits, as the paper
//! prescribes: a VM whose storage is gone could not do useful work anyway.
//!
//! A generation's pair *starts* (`gen-N.started`, [`Arbiter::mark_started`])
//! once its backup holds the VM and the side it replaces can no longer
//! go live (a running VM protected again, a backup moved). Only a started
//! generation's sides may go live, and none of an older generation once a
//! newer one has started: an old backup that wakes up (stopped, cut off)
//! after its VM was protected anew finds it superseded and halts. One
//! shared directory is one VM's: its generations are that VM's pairs.
//!
//! With isolation addresses ([`Arbiter::with_isolation`]), a side first
//! checks that it can reach the outside; one that cannot defers to the
//! other side (see [`crate::isolation`]), so the side that can serve wins.

use crate::isolation::{self, Isolation, Outside, PROBE_WAIT};
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often an unreachable storage is tried again, and an isolated side
/// looks whether the other side has claimed.
const RETRY: Duration = Duration::from_millis(100);
/// Generations tried when claiming one raced with another pair.
const CLAIM_TRIES: u64 = 1000;

/// Why no generation could be claimed for a new pair.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    /// The shared storage's directory could not be listed.
    #[error("cannot read the shared storage {}: {source}", .dir.display())]
    ReadStorage {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Creating the `.pair` file of a free generation failed.
    #[error("cannot claim a generation in {}: {source}", .dir.display())]
    Claim {
        dir: PathBuf,
        generation: u64,
        #[source]
        source: std::io::Error,
    },
    /// The generation's start could not be recorded.
    #[error("cannot record the start of generation {generation} in {}: {source}", .dir.display())]
    Start {
        dir: PathBuf,
        generation: u64,
        #[source]
        source: std::io::Error,
    },
    /// Every generation tried, `tries` of them from `first` on, was
    /// claimed by someone else first.
    #[error("cannot claim a generation in {}: all taken", .dir.display())]
    AllTaken { dir: PathBuf, first: u64, tries: u64 },
}

/// Why a backup does not see its primary's shared storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageMismatch {
    #[error("{} holds no record of generation {generation}", .dir.display())]
    NoRecord { dir: PathBuf, generation: u64 },
    #[error("generation {generation}'s record in {} was written by another primary", .dir.display())]
    OtherToken { dir: PathBuf, generation: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This side may go live.
    Won,
    /// The other side already went live (its name is given): halt.
    Lost(String),
}

/// What a side hears on its way to the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArbiterNote {
    /// The shared storage cannot be reached: the side waits for it.
    StorageUnreachable { dir: PathBuf, problem: String },
    /// No isolation address answered: this side may be the one cut off,
    /// and waits up to `defer` for the other side to claim.
    Isolated { addresses: Vec<Ipv4Addr>, defer: Duration },
    /// An isolated side reached the outside again, and contends.
    OutsideReached(Ipv4Addr),
    /// An isolated side waited its deferral out with no claim, and contends.
    DeferralOver,
    /// The isolation addresses could not be probed: the side contends at once.
    NotChecked(String),
}

impl std::fmt::Display for ArbiterNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArbiterNote::StorageUnreachable { dir, problem } => {
                write!(f, "the shared storage {} cannot be reached ({problem}); waiting", dir.display())
            }
            ArbiterNote::Isolated { addresses, defer } => {
                let list: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
                write!(
                    f,
                    "no isolation address answers ({}): this host may be the one cut off; \
                     leaving the arbiter to the other side for up to {} ms",
                    list.join(", "),
                    defer.as_millis()
                )
            }
            ArbiterNote::OutsideReached(a) => write!(f, "isolation address {a} answers again; contending"),
            ArbiterNote::DeferralOver => write!(f, "the other side did not claim the arbiter; contending"),
            ArbiterNote::NotChecked(why) => write!(f, "{why}; contending without the isolation check"),
        }
    }
}

pub struct Arbiter {
    dir: PathBuf,
    generation: u64,
    /// The storage token of a generation this side claimed ("" otherwise).
    token: String,
    /// Checked before contending, if set.
    isolation: Option<Isolation>,
}

impl Arbiter {
    pub fn new(dir: &Path, generation: u64) -> Arbiter {
        Arbiter { dir: dir.to_path_buf(), generation, token: String::new(), isolation: None }
    }

    /// Before contending, this side checks that it reaches the outside.
    pub fn with_isolation(mut self, isolation: Option<Isolation>) -> Arbiter {
        self.isolation = isolation;
        self
    }

    /// The token written into the claimed generation's record.
    pub fn storage_token(&self) -> &str {
        &self.token
    }

    /// Whether `dir` holds the record of `generation` with `token`: the
    /// backup's proof that it sees the storage its primary claimed on.
    pub fn check_storage(dir: &Path, generation: u64, token: &str) -> Result<(), StorageMismatch> {
        let path = dir.join(format!("gen-{generation}.pair"));
        let mut text = String::new();
        let read = std::fs::File::open(&path).and_then(|f| f.take(4096).read_to_string(&mut text));
        if read.is_err() {
            return Err(StorageMismatch::NoRecord { dir: dir.to_path_buf(), generation });
        }
        let theirs = text.lines().find_map(|l| l.strip_prefix("storage-token "));
        // An empty token is no proof: it matches nothing.
        if token.is_empty() || theirs != Some(token) {
            return Err(StorageMismatch::OtherToken { dir: dir.to_path_buf(), generation });
        }
        Ok(())
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Claims the next unused generation in `dir` for a new pair: one past
    /// the highest there, taken by creating its `.pair` file exclusively.
    pub fn claim_generation(dir: &Path, pair: &str) -> Result<Arbiter, ArbiterError> {
        let entries =
            std::fs::read_dir(dir).map_err(|source| ArbiterError::ReadStorage { dir: dir.to_path_buf(), source })?;
        let highest = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("gen-")?.split('.').next()?.parse::<u64>().ok()
            })
            .max()
            .unwrap_or(0);
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| ArbiterError::Claim {
            dir: dir.to_path_buf(),
            generation: highest + 1,
            source: std::io::Error::other(e.to_string()),
        })?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
        for generation in highest + 1..highest + 1 + CLAIM_TRIES {
            let path = dir.join(format!("gen-{generation}.pair"));
            match create_exclusive(&path, &format!("{pair}\nstorage-token {token}\n")) {
                Ok(true) => return Ok(Arbiter { dir: dir.to_path_buf(), generation, token, isolation: None }),
                Ok(false) => continue,
                Err(source) => return Err(ArbiterError::Claim { dir: dir.to_path_buf(), generation, source }),
            }
        }
        Err(ArbiterError::AllTaken { dir: dir.to_path_buf(), first: highest + 1, tries: CLAIM_TRIES })
    }

    /// Marks this generation's pair as started: from now on its sides may
    /// go live, and no older generation's may. The caller makes sure first
    /// that the pair it replaces cannot go live any more (its backup
    /// stopped, or its generation claimed by the caller).
    pub fn mark_started(&self) -> Result<(), ArbiterError> {
        create_exclusive(&self.dir.join(format!("gen-{}.started", self.generation)), "")
            .map(|_| ())
            .map_err(|source| ArbiterError::Start { dir: self.dir.clone(), generation: self.generation, source })
    }

    /// Whether this generation has started, and the newest started
    /// generation after it, if any.
    fn standing(&self) -> std::io::Result<(bool, Option<u64>)> {
        let mut started = false;
        let mut newer = None;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix("gen-")?.strip_suffix(".started")?.parse().ok())
            else {
                continue;
            };
            if n == self.generation {
                started = true;
            } else if n > self.generation && newer < Some(n) {
                newer = Some(n);
            }
        }
        Ok((started, newer))
    }

    /// The test-and-set: `Won` if this call created the generation's
    /// `.live` file, `Lost` if someone else had, or if the generation never
    /// started or a newer one has (its reason given as the winner). Waits,
    /// retrying, while the storage cannot be reached (`on_note` hears about
    /// it once). With isolation addresses, a side that reaches none of them
    /// first leaves the other side time to claim (see [`crate::isolation`]).
    pub fn go_live(&self, me: &str, mut on_note: impl FnMut(ArbiterNote)) -> Verdict {
        if let Some(iso) = &self.isolation {
            if let Some(winner) = self.defer_while_isolated(iso, &mut on_note) {
                return Verdict::Lost(winner);
            }
        }
        let path = self.live_path();
        let mut told = false;
        loop {
            // A claim already made is the answer, whoever made it.
            if let Some(winner) = self.winner() {
                return Verdict::Lost(winner);
            }
            let standing = self.standing();
            if let Ok((started, newer)) = &standing {
                if let Some(n) = newer {
                    return Verdict::Lost(format!("generation {n}, a newer pair of this VM"));
                }
                if !started {
                    return Verdict::Lost(format!("nobody: generation {} never started", self.generation));
                }
            }
            let created = standing.and_then(|_| create_exclusive(&path, me));
            let problem = match created {
                Ok(true) => return Verdict::Won,
                Ok(false) => match std::fs::read_to_string(&path) {
                    // The winner writes its name right after creating the
                    // file; an empty read means we looked in between.
                    Ok(who) if !who.is_empty() => return Verdict::Lost(who.trim().to_string()),
                    Ok(_) => None,
                    Err(e) => Some(e.to_string()),
                },
                Err(e) => Some(e.to_string()),
            };
            if let Some(problem) = problem {
                if !told {
                    on_note(ArbiterNote::StorageUnreachable { dir: self.dir.clone(), problem });
                    told = true;
                }
            }
            std::thread::sleep(RETRY);
        }
    }

    /// An isolated side's wait: None once it may contend (the outside
    /// answers, or the deferral ran out with no claim), or the other
    /// side's name once it has claimed.
    fn defer_while_isolated(&self, iso: &Isolation, on_note: &mut impl FnMut(ArbiterNote)) -> Option<String> {
        match iso.probe(PROBE_WAIT) {
            Outside::Reached(_) => return None,
            Outside::NotChecked(why) => {
                on_note(ArbiterNote::NotChecked(why));
                return None;
            }
            Outside::Unreached => {}
        }
        on_note(ArbiterNote::Isolated { addresses: iso.addresses().to_vec(), defer: iso.defer() });
        let until = Instant::now() + iso.defer();
        let mut next_probe = Instant::now();
        let mut winner = None;
        let mut reached = None;
        isolation::wait_until(until, RETRY, || {
            winner = self.winner();
            if winner.is_some() {
                return true;
            }
            if Instant::now() >= next_probe {
                if let Outside::Reached(a) = iso.probe(RETRY) {
                    reached = Some(a);
                    return true;
                }
                next_probe = Instant::now() + RETRY;
            }
            false
        });
        match (winner, reached) {
            (Some(w), _) => Some(w),
            (None, Some(a)) => {
                on_note(ArbiterNote::OutsideReached(a));
                None
            }
            _ => {
                on_note(ArbiterNote::DeferralOver);
                None
            }
        }
    }

    /// Who went live in this generation, if anyone has.
    pub fn winner(&self) -> Option<String> {
        let mut s = String::new();
        std::fs::File::open(self.live_path()).ok()?.read_to_string(&mut s).ok()?;
        (!s.is_empty()).then(|| s.trim().to_string())
    }

    fn live_path(&self) -> PathBuf {
        self.dir.join(format!("gen-{}.live", self.generation))
    }
}

/// Creates `path` only if it does not exist, writing `content` durably.
/// `Ok(false)`: it existed.
fn create_exclusive(path: &Path, content: &str) -> std::io::Result<bool> {
    match OpenOptions::new().write(true).create_new(true).mode(0o644).open(path) {
        Ok(mut f) => {
            f.write_all(content.as_bytes())?;
            f.sync_all()?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    use crate::isolation::cut_off;

    /// Checked from a host cut off from everything ([`cut_off`]): loopback
    /// does not answer there either.
    fn isolated(defer: Duration) -> Option<Isolation> {
        Some(Isolation::new(vec![Ipv4Addr::LOCALHOST], defer))
    }

    #[test]
    fn an_isolated_side_leaves_the_arbiter_to_the_other() {
        let dir = scratch("isolated");
        let gen = started(&dir);
        let cut_off = Arbiter::new(&dir, gen).with_isolation(isolated(Duration::from_secs(20)));
        let t0 = Instant::now();
        let waiting = std::thread::spawn(move || {
            self::cut_off(move || {
                let mut notes = Vec::new();
                let v = cut_off.go_live("primary", |n| notes.push(n));
                (v, notes)
            })
        });
        // The side that reaches the outside (no addresses to check here)
        // comes a little later, and wins.
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(Arbiter::new(&dir, gen).go_live("backup", |_| {}), Verdict::Won);
        let (v, notes) = waiting.join().unwrap();
        assert_eq!(v, Verdict::Lost("backup".into()));
        assert!(matches!(notes[..], [ArbiterNote::Isolated { .. }]), "{notes:?}");
        // It learned of the claim within a few retries, not at the end of its deferral.
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn an_isolated_side_contends_once_nobody_claimed_within_its_deferral() {
        let dir = scratch("alone");
        let gen = started(&dir);
        let a = Arbiter::new(&dir, gen).with_isolation(isolated(Duration::from_millis(500)));
        let (v, notes, took) = cut_off(move || {
            let mut notes = Vec::new();
            let t0 = Instant::now();
            let v = a.go_live("primary", |n| notes.push(n));
            (v, notes, t0.elapsed())
        });
        assert_eq!(v, Verdict::Won);
        assert!(took >= Duration::from_millis(500), "{took:?}");
        assert!(matches!(notes[..], [ArbiterNote::Isolated { .. }, ArbiterNote::DeferralOver]), "{notes:?}");
    }

    #[test]
    fn a_side_that_reaches_the_outside_contends_at_once() {
        let dir = scratch("reached");
        let gen = started(&dir);
        // One address that nothing answers (TEST-NET-2, RFC 5737), one that does.
        let iso = Isolation::new(vec![Ipv4Addr::new(198, 51, 100, 1), Ipv4Addr::LOCALHOST], Duration::from_secs(20));
        let mut notes = Vec::new();
        let t0 = Instant::now();
        assert_eq!(
            Arbiter::new(&dir, gen).with_isolation(Some(iso)).go_live("backup", |n| notes.push(n)),
            Verdict::Won
        );
        // Loopback answers at once; NOWHERE is not waited for.
        assert!(t0.elapsed() < PROBE_WAIT, "{:?}", t0.elapsed());
        assert!(notes.is_empty(), "{notes:?}");
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ftvm-arbiter-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn exactly_one_of_many_racers_wins() {
        let dir = scratch("race");
        let gen = started(&dir);
        let a = Arbiter::new(&dir, gen);
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (dir, barrier) = (dir.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    Arbiter::new(&dir, gen).go_live(&format!("racer{i}"), |_| {})
                })
            })
            .collect();
        let verdicts: Vec<Verdict> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let winners = verdicts.iter().filter(|v| **v == Verdict::Won).count();
        assert_eq!(winners, 1, "{verdicts:?}");
        let who = a.winner().unwrap();
        for v in &verdicts {
            if let Verdict::Lost(w) = v {
                assert_eq!(*w, who);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_the_claimed_storage_proves_itself() {
        let dir = scratch("token");
        let other = scratch("token-other");
        let a = Arbiter::claim_generation(&dir, "p").unwrap();
        let g = a.generation();
        Arbiter::check_storage(&dir, g, a.storage_token()).unwrap();
        // Another directory with a record of the same generation, by
        // another primary: not the same storage.
        let b = Arbiter::claim_generation(&other, "p").unwrap();
        assert_eq!(b.generation(), g);
        assert!(matches!(
            Arbiter::check_storage(&other, g, a.storage_token()),
            Err(StorageMismatch::OtherToken { .. })
        ));
        assert!(matches!(
            Arbiter::check_storage(&other, g + 1, a.storage_token()),
            Err(StorageMismatch::NoRecord { .. })
        ));
        assert!(Arbiter::check_storage(&dir, g, "").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }

    /// A generation claimed in `dir` and started.
    fn started(dir: &Path) -> u64 {
        let a = Arbiter::claim_generation(dir, "pair").unwrap();
        a.mark_started().unwrap();
        a.generation()
    }

    #[test]
    fn generations_are_fresh_and_independent() {
        let dir = scratch("gen");
        let g1 = Arbiter::claim_generation(&dir, "p").unwrap();
        g1.mark_started().unwrap();
        assert_eq!(g1.go_live("backup", |_| {}), Verdict::Won);
        let g2 = Arbiter::claim_generation(&dir, "p").unwrap();
        g2.mark_started().unwrap();
        assert!(g2.generation() > g1.generation());
        assert_eq!(g2.winner(), None);
        assert_eq!(g2.go_live("primary", |_| {}), Verdict::Won);
        assert_eq!(g1.go_live("primary", |_| {}), Verdict::Lost("backup".into()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Only a started generation's sides go live, and none of an older
    /// one once a newer has started: an old backup that wakes up after
    /// its VM was protected anew halts (issue 28).
    #[test]
    fn a_generation_goes_live_only_started_and_not_superseded() {
        let dir = scratch("superseded");
        let old = Arbiter::claim_generation(&dir, "p").unwrap();
        old.mark_started().unwrap();
        let new = Arbiter::claim_generation(&dir, "p").unwrap();
        // Not started: the transfer to its backup never completed.
        assert!(matches!(new.go_live("new backup", |_| {}), Verdict::Lost(w) if w.contains("never started")));
        assert_eq!(new.winner(), None, "a refusal claims nothing");
        // The old pair's backup could still take over then ...
        let (old_dir, g) = (dir.clone(), old.generation());
        new.mark_started().unwrap();
        // ... but not once the new one has started.
        let v = Arbiter::new(&old_dir, g).go_live("old backup", |_| {});
        assert!(matches!(&v, Verdict::Lost(w) if w.contains(&format!("generation {}", new.generation()))), "{v:?}");
        assert_eq!(old.winner(), None);
        assert_eq!(new.go_live("new backup", |_| {}), Verdict::Won);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_storage_that_cannot_be_read_is_an_error_that_names_it() {
        let gone = scratch("gone").join("not-there");
        let e = Arbiter::claim_generation(&gone, "p").err().expect("nothing to read");
        assert!(matches!(&e, ArbiterError::ReadStorage { dir, .. } if *dir == gone), "{e:?}");
        assert!(e.to_string().starts_with(&format!("cannot read the shared storage {}: ", gone.display())), "{e}");
        std::fs::remove_dir_all(gone.parent().unwrap()).unwrap();
    }

    #[test]
    fn waits_while_the_storage_is_unreachable() {
        let dir = scratch("wait");
        let gone = dir.join("not-mounted-yet");
        let a = Arbiter::new(&gone, 1);
        let mounted = {
            let gone = gone.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                // Mounted with generation 1 started, at once.
                let ready = gone.with_extension("part");
                std::fs::create_dir(&ready).unwrap();
                std::fs::write(ready.join("gen-1.started"), "").unwrap();
                std::fs::rename(&ready, &gone).unwrap();
            })
        };
        let t0 = std::time::Instant::now();
        let mut waits = Vec::new();
        assert_eq!(a.go_live("primary", |m| waits.push(m.to_string())), Verdict::Won);
        assert!(t0.elapsed() >= Duration::from_millis(400));
        assert_eq!(waits.len(), 1, "told once: {waits:?}");
        assert!(waits[0].contains("cannot be reached"), "{waits:?}");
        mounted.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
