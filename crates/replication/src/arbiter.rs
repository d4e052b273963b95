//! Split-brain protection (VMware FT §2.3): before a primary or a backup
//! goes live alone it must win an atomic test-and-set on storage both
//! sides reach. Two stores implement it ([`ArbiterStore`]): a directory
//! both hosts reach ([`SharedDir`]: NFS, a cluster file system, or on one
//! machine a plain directory), the embedded default for a bare pair, where
//! the test-and-set is the exclusive creation of one file per protected
//! pair's *generation*, which POSIX makes atomic (`O_CREAT | O_EXCL`, also
//! over NFSv3 and later); and, for a cluster, a majority-replicated key
//! store (etcd, in the `ftvm-etcd` crate: the paper's "third-party
//! server"), where it is a transaction. The winner records its name; the
//! loser reads it.
//!
//! Each start of protection claims a fresh generation number, so the claim
//! of an old failover never decides a new one. The generation's record
//! holds a random *storage token* the primary also sends its backup: a
//! backup that reads another token (or none) through its own path to the
//! store does not see the primary's store, the test-and-set would not be
//! one, and it refuses to follow ([`Arbiter::check_storage`]).
//! While the store cannot be reached the caller waits, as the paper
//! prescribes: a VM whose storage is gone could not do useful work anyway
//! (and an etcd without a quorum cannot promise that one side wins).
//!
//! A generation's pair *starts* ([`Arbiter::mark_started`]) once its
//! backup holds the VM and the side it replaces can no longer go live (a
//! running VM protected again, a backup moved). Only a started
//! generation's sides may go live, and none of an older generation once a
//! newer one has started: an old backup that wakes up (stopped, cut off)
//! after its VM was protected anew finds it superseded and halts. One
//! shared directory (one etcd prefix) is one VM's: its generations are
//! that VM's pairs.
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
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often an unreachable store is tried again, and an isolated side
/// looks whether the other side has claimed.
const RETRY: Duration = Duration::from_millis(100);
/// Generations tried when claiming one raced with another pair.
pub const CLAIM_TRIES: u64 = 1000;

/// Why no generation could be claimed for a new pair, or its start not
/// recorded. `store` is the store as [`ArbiterStore::describe`] names it.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    /// The store could not be read.
    #[error("cannot read {store}: {problem}")]
    Unreachable { store: String, problem: String },
    /// Recording the claim of a free generation failed.
    #[error("cannot claim a generation in {store}: {problem}")]
    Claim { store: String, generation: u64, problem: String },
    /// The generation's start could not be recorded.
    #[error("cannot record the start of generation {generation} in {store}: {problem}")]
    Start { store: String, generation: u64, problem: String },
    /// Every generation tried, `tries` of them from `first` on, was
    /// claimed by someone else first.
    #[error("cannot claim a generation in {store}: all taken")]
    AllTaken { store: String, first: u64, tries: u64 },
}

/// Why a backup does not see its primary's store.
#[derive(Debug, thiserror::Error)]
pub enum StorageMismatch {
    #[error("{store} holds no record of generation {generation}")]
    NoRecord { store: String, generation: u64 },
    #[error("generation {generation}'s record in {store} was written by another primary")]
    OtherToken { store: String, generation: u64 },
    #[error("cannot read {store}: {problem}")]
    Unreachable { store: String, problem: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This side may go live.
    Won,
    /// The other side already went live (its name is given): halt.
    Lost(String),
}

/// One try at the test-and-set ([`ArbiterStore::try_go_live`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This try made the claim.
    Won,
    /// Someone else holds it (their name), or this generation may not go
    /// live (the reason).
    Lost(String),
    /// Undecided (the shared directory's winner had not written its name
    /// yet): try again.
    Again,
}

/// What a side hears on its way to the verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArbiterNote {
    /// The store cannot be reached: the side waits for it.
    StorageUnreachable { store: String, problem: String },
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
            ArbiterNote::StorageUnreachable { store, problem } => {
                write!(f, "{store} cannot be reached ({problem}); waiting")
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

/// Where one VM's pairs record their generations: the store behind the
/// test-and-set. Each call is one try; waiting and retrying while the
/// store cannot be reached is [`Arbiter`]'s. An `Err(String)` says why the
/// store could not be reached.
pub trait ArbiterStore: Send + Sync {
    /// The store as a message names it: "the shared storage /srv/ft",
    /// "etcd (http://10.0.0.1:2379) at /ftvm/vms/redis".
    fn describe(&self) -> String;
    /// Claims the lowest free generation above every one recorded, its
    /// record naming `pair` and holding `token`.
    fn claim_next(&self, pair: &str, token: &str) -> Result<u64, ArbiterError>;
    /// The storage token of a generation's record, if it has one.
    fn token(&self, generation: u64) -> Result<Option<String>, String>;
    /// Records that a generation's pair started.
    fn mark_started(&self, generation: u64) -> Result<(), ArbiterError>;
    /// The test-and-set for `generation`, on behalf of `me`: won only if
    /// nobody holds it, the generation started and no newer one has.
    fn try_go_live(&self, generation: u64, me: &str) -> Result<Attempt, String>;
    /// Who went live in this generation, if anyone has.
    fn winner(&self, generation: u64) -> Result<Option<String>, String>;
    /// Takes back the record of a generation whose start failed before
    /// any backup could have read it (its header was never sent).
    fn abandon(&self, generation: u64);
}

/// One generation of a VM's pairs at its arbiter: what a side holds to
/// contend, and the primary to record its pair's start.
pub struct Arbiter {
    store: Arc<dyn ArbiterStore>,
    generation: u64,
    /// The storage token of a generation this side claimed ("" otherwise).
    token: String,
    /// Checked before contending, if set.
    isolation: Option<Isolation>,
}

impl Arbiter {
    pub fn new(store: Arc<dyn ArbiterStore>, generation: u64) -> Arbiter {
        Arbiter { store, generation, token: String::new(), isolation: None }
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

    /// Whether `store` holds the record of `generation` with `token`: the
    /// backup's proof that it sees the store its primary claimed in.
    pub fn check_storage(store: &dyn ArbiterStore, generation: u64, token: &str) -> Result<(), StorageMismatch> {
        let theirs = store
            .token(generation)
            .map_err(|problem| StorageMismatch::Unreachable { store: store.describe(), problem })?;
        let Some(theirs) = theirs else {
            return Err(StorageMismatch::NoRecord { store: store.describe(), generation });
        };
        // An empty token is no proof: it matches nothing.
        if token.is_empty() || theirs != token {
            return Err(StorageMismatch::OtherToken { store: store.describe(), generation });
        }
        Ok(())
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The store this generation is recorded in.
    pub fn store(&self) -> &Arc<dyn ArbiterStore> {
        &self.store
    }

    /// Claims the next unused generation in `store` for a new pair, with a
    /// fresh storage token.
    pub fn claim_generation(store: Arc<dyn ArbiterStore>, pair: &str) -> Result<Arbiter, ArbiterError> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| ArbiterError::Claim {
            store: store.describe(),
            generation: 0,
            problem: e.to_string(),
        })?;
        let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
        let generation = store.claim_next(pair, &token)?;
        Ok(Arbiter { store, generation, token, isolation: None })
    }

    /// Marks this generation's pair as started: from now on its sides may
    /// go live, and no older generation's may. The caller makes sure first
    /// that the pair it replaces cannot go live any more (its backup
    /// stopped, or its generation claimed by the caller).
    pub fn mark_started(&self) -> Result<(), ArbiterError> {
        self.store.mark_started(self.generation)
    }

    /// The test-and-set: `Won` if this call made the generation's claim,
    /// `Lost` if someone else had, or if the generation never started or
    /// a newer one has (its reason given as the winner). Waits, retrying,
    /// while the store cannot be reached (`on_note` hears about it once).
    /// With isolation addresses, a side that reaches none of them first
    /// leaves the other side time to claim (see [`crate::isolation`]).
    pub fn go_live(&self, me: &str, mut on_note: impl FnMut(ArbiterNote)) -> Verdict {
        if let Some(iso) = &self.isolation {
            if let Some(winner) = self.defer_while_isolated(iso, &mut on_note) {
                return Verdict::Lost(winner);
            }
        }
        let mut told = false;
        loop {
            match self.store.try_go_live(self.generation, me) {
                Ok(Attempt::Won) => return Verdict::Won,
                // This side's own claim, made by a try whose answer was
                // lost (a store's retried request): it won.
                Ok(Attempt::Lost(who)) if who == me => return Verdict::Won,
                Ok(Attempt::Lost(who)) => return Verdict::Lost(who),
                Ok(Attempt::Again) => {}
                Err(problem) => {
                    if !told {
                        on_note(ArbiterNote::StorageUnreachable { store: self.store.describe(), problem });
                        told = true;
                    }
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

    /// Who went live in this generation, if anyone has (None also while
    /// the store cannot be read).
    pub fn winner(&self) -> Option<String> {
        self.store.winner(self.generation).ok().flatten()
    }
}

/// The arbiter on a directory both hosts reach: `gen-N.pair` (the claim of
/// generation N, with its token), `gen-N.started`, `gen-N.live` (the
/// test-and-set, holding the winner's name).
#[derive(Debug, Clone)]
pub struct SharedDir {
    dir: PathBuf,
}

impl SharedDir {
    pub fn new(dir: &Path) -> SharedDir {
        SharedDir { dir: dir.to_path_buf() }
    }

    /// The same, ready to be shared by the sides' arbiters.
    pub fn store(dir: &Path) -> Arc<dyn ArbiterStore> {
        Arc::new(SharedDir::new(dir))
    }

    fn path(&self, generation: u64, what: &str) -> PathBuf {
        self.dir.join(format!("gen-{generation}.{what}"))
    }

    /// Whether `generation` has started, and the newest started
    /// generation after it, if any.
    fn standing(&self, generation: u64) -> std::io::Result<(bool, Option<u64>)> {
        let mut started = false;
        let mut newer = None;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix("gen-")?.strip_suffix(".started")?.parse().ok())
            else {
                continue;
            };
            if n == generation {
                started = true;
            } else if n > generation && newer < Some(n) {
                newer = Some(n);
            }
        }
        Ok((started, newer))
    }
}

impl ArbiterStore for SharedDir {
    fn describe(&self) -> String {
        format!("the shared storage {}", self.dir.display())
    }

    fn claim_next(&self, pair: &str, token: &str) -> Result<u64, ArbiterError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| ArbiterError::Unreachable { store: self.describe(), problem: e.to_string() })?;
        let highest = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix("gen-")?.split('.').next()?.parse::<u64>().ok()
            })
            .max()
            .unwrap_or(0);
        for generation in highest + 1..highest + 1 + CLAIM_TRIES {
            match create_exclusive(&self.path(generation, "pair"), &format!("{pair}\nstorage-token {token}\n")) {
                Ok(true) => return Ok(generation),
                Ok(false) => continue,
                Err(e) => {
                    return Err(ArbiterError::Claim { store: self.describe(), generation, problem: e.to_string() })
                }
            }
        }
        Err(ArbiterError::AllTaken { store: self.describe(), first: highest + 1, tries: CLAIM_TRIES })
    }

    fn token(&self, generation: u64) -> Result<Option<String>, String> {
        let mut text = String::new();
        match std::fs::File::open(self.path(generation, "pair")).and_then(|f| f.take(4096).read_to_string(&mut text)) {
            Ok(_) => Ok(text.lines().find_map(|l| l.strip_prefix("storage-token ")).map(str::to_string)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn mark_started(&self, generation: u64) -> Result<(), ArbiterError> {
        create_exclusive(&self.path(generation, "started"), "").map(|_| ()).map_err(|e| ArbiterError::Start {
            store: self.describe(),
            generation,
            problem: e.to_string(),
        })
    }

    fn try_go_live(&self, generation: u64, me: &str) -> Result<Attempt, String> {
        // A claim already made is the answer, whoever made it.
        if let Some(winner) = self.winner(generation)? {
            return Ok(Attempt::Lost(winner));
        }
        let (started, newer) = self.standing(generation).map_err(|e| e.to_string())?;
        if let Some(n) = newer {
            return Ok(Attempt::Lost(format!("generation {n}, a newer pair of this VM")));
        }
        if !started {
            return Ok(Attempt::Lost(format!("nobody: generation {generation} never started")));
        }
        let path = self.path(generation, "live");
        match create_exclusive(&path, me) {
            Ok(true) => Ok(Attempt::Won),
            Ok(false) => match std::fs::read_to_string(&path) {
                Ok(who) if !who.is_empty() => Ok(Attempt::Lost(who.trim().to_string())),
                // The winner writes its name right after creating the
                // file; an empty read means we looked in between.
                Ok(_) => Ok(Attempt::Again),
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    fn winner(&self, generation: u64) -> Result<Option<String>, String> {
        let mut s = String::new();
        match std::fs::File::open(self.path(generation, "live")).and_then(|mut f| f.read_to_string(&mut s)) {
            Ok(_) => Ok((!s.is_empty()).then(|| s.trim().to_string())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn abandon(&self, generation: u64) {
        let _ = std::fs::remove_file(self.path(generation, "pair"));
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
        let cut_off = Arbiter::new(SharedDir::store(&dir), gen).with_isolation(isolated(Duration::from_secs(20)));
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
        assert_eq!(Arbiter::new(SharedDir::store(&dir), gen).go_live("backup", |_| {}), Verdict::Won);
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
        let a = Arbiter::new(SharedDir::store(&dir), gen).with_isolation(isolated(Duration::from_millis(500)));
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
            Arbiter::new(SharedDir::store(&dir), gen).with_isolation(Some(iso)).go_live("backup", |n| notes.push(n)),
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
        let a = Arbiter::new(SharedDir::store(&dir), gen);
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (dir, barrier) = (dir.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    Arbiter::new(SharedDir::store(&dir), gen).go_live(&format!("racer{i}"), |_| {})
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
        let a = Arbiter::claim_generation(SharedDir::store(&dir), "p").unwrap();
        let g = a.generation();
        Arbiter::check_storage(&SharedDir::new(&dir), g, a.storage_token()).unwrap();
        // Another directory with a record of the same generation, by
        // another primary: not the same storage.
        let b = Arbiter::claim_generation(SharedDir::store(&other), "p").unwrap();
        assert_eq!(b.generation(), g);
        assert!(matches!(
            Arbiter::check_storage(&SharedDir::new(&other), g, a.storage_token()),
            Err(StorageMismatch::OtherToken { .. })
        ));
        assert!(matches!(
            Arbiter::check_storage(&SharedDir::new(&other), g + 1, a.storage_token()),
            Err(StorageMismatch::NoRecord { .. })
        ));
        assert!(Arbiter::check_storage(&SharedDir::new(&dir), g, "").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }

    /// A generation claimed in `dir` and started.
    fn started(dir: &Path) -> u64 {
        let a = Arbiter::claim_generation(SharedDir::store(dir), "pair").unwrap();
        a.mark_started().unwrap();
        a.generation()
    }

    #[test]
    fn generations_are_fresh_and_independent() {
        let dir = scratch("gen");
        let g1 = Arbiter::claim_generation(SharedDir::store(&dir), "p").unwrap();
        g1.mark_started().unwrap();
        assert_eq!(g1.go_live("backup", |_| {}), Verdict::Won);
        let g2 = Arbiter::claim_generation(SharedDir::store(&dir), "p").unwrap();
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
        let old = Arbiter::claim_generation(SharedDir::store(&dir), "p").unwrap();
        old.mark_started().unwrap();
        let new = Arbiter::claim_generation(SharedDir::store(&dir), "p").unwrap();
        // Not started: the transfer to its backup never completed.
        assert!(matches!(new.go_live("new backup", |_| {}), Verdict::Lost(w) if w.contains("never started")));
        assert_eq!(new.winner(), None, "a refusal claims nothing");
        // The old pair's backup could still take over then ...
        let (old_dir, g) = (dir.clone(), old.generation());
        new.mark_started().unwrap();
        // ... but not once the new one has started.
        let v = Arbiter::new(SharedDir::store(&old_dir), g).go_live("old backup", |_| {});
        assert!(matches!(&v, Verdict::Lost(w) if w.contains(&format!("generation {}", new.generation()))), "{v:?}");
        assert_eq!(old.winner(), None);
        assert_eq!(new.go_live("new backup", |_| {}), Verdict::Won);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_storage_that_cannot_be_read_is_an_error_that_names_it() {
        let gone = scratch("gone").join("not-there");
        let e = Arbiter::claim_generation(SharedDir::store(&gone), "p").err().expect("nothing to read");
        assert!(matches!(&e, ArbiterError::Unreachable { .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("cannot read the shared storage {}: ", gone.display())), "{e}");
        std::fs::remove_dir_all(gone.parent().unwrap()).unwrap();
    }

    #[test]
    fn waits_while_the_storage_is_unreachable() {
        let dir = scratch("wait");
        let gone = dir.join("not-mounted-yet");
        let a = Arbiter::new(SharedDir::store(&gone), 1);
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
