//! A blocking etcd client: etcd's own async client (`etcd-client`) driven
//! by a runtime of its own, for callers that are plain threads (the VMM's).
//! Every request has a deadline, so an etcd that lost its quorum, or a
//! member that cannot be reached, is an error the caller can wait out and
//! retry, never a hang.
//!
//! A request goes to one member at a time: the one that answered last
//! (at first the first endpoint, which the agent makes its own host's).
//! When the leader dies with its host, a write sent to any member is lost
//! with it (a follower forwards it to the dead leader) and nothing commits
//! until the others elect a new one; the request must then be sent again.
//! So while a try waits longer than [`WATCH_AFTER`], every member is asked
//! who leads (etcd's `Status`, each within [`PROBE`], again every
//! [`PROBE_EVERY`]), and once a member says it leads that is not the
//! leader the waiting member named (when asked just before the request
//! went to it, else when first asked during the try), the request goes to
//! that new leader at once, rather than at the end of the try. A try that
//! fails moves to the member the same questions find best: the leader,
//! else one that follows a leader, else one that answers at all; a member
//! that did not answer is never chosen over one that did.

use crate::endpoints::{Endpoints, REQUEST_TIMEOUT};
use etcd_client::{Client, GetOptions, Txn, TxnResponse};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Pause between the tries of one request while no member leads.
const RETRY: Duration = Duration::from_millis(50);
/// How long the first try of a request may take before the next try goes
/// to another member; each later try may take this much more. A member
/// on a host that vanished (no FIN, no RST) never answers: a try bounded
/// by the whole request's timeout would spend it all there.
const FIRST_TRY: Duration = Duration::from_millis(400);
/// How long a try waits before the members are asked who leads: a
/// request answers in a few ms when etcd is well, even on a loaded host.
const WATCH_AFTER: Duration = Duration::from_millis(100);
/// How long a member may take to say who leads.
const PROBE: Duration = Duration::from_millis(250);
/// The pause between two questions to one member while a try waits.
const PROBE_EVERY: Duration = Duration::from_millis(50);

/// What a member said when asked who leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// It leads (its member id).
    Leads(u64),
    /// It follows the leader with this member id.
    Follows(u64),
    /// It has no leader: an election is on, or it is cut off.
    NoLeader,
    /// No answer within [`PROBE`], or its connection failed.
    Silent,
}

impl Seen {
    /// The leader it names, if any.
    fn leader(self) -> Option<u64> {
        match self {
            Seen::Leads(id) | Seen::Follows(id) => Some(id),
            Seen::NoLeader | Seen::Silent => None,
        }
    }
}

/// While a try waits on a member that said `start` when first asked: the
/// member to send the request to instead, if one says it leads and is not
/// the leader `start` named (a new leader: the request was most likely
/// lost with the old one, or sent where no leader was). `seen`: what each
/// member said last.
fn moved(start: Seen, seen: &[Option<Seen>]) -> Option<usize> {
    seen.iter().position(|s| matches!(s, Some(Seen::Leads(id)) if start.leader() != Some(*id)))
}

/// After a failed try on member `on`: the member the next try goes to.
/// The leader; else one that follows a leader; else one that answers;
/// among equals, the others before `on`, in turn; none answered: the next.
fn next_after(on: usize, seen: &[Option<Seen>]) -> usize {
    let n = seen.len();
    let rank = |s: Option<Seen>| match s {
        Some(Seen::Leads(_)) => 0,
        Some(Seen::Follows(_)) => 1,
        Some(Seen::NoLeader) => 2,
        Some(Seen::Silent) | None => 3,
    };
    (1..=n).map(|k| (on + k) % n).min_by_key(|&i| rank(seen[i])).filter(|&i| rank(seen[i]) < 3).unwrap_or((on + 1) % n)
}

/// How one try ended.
enum Outcome<T> {
    Answered(T),
    /// A new leader (and what it said): send the request there at once.
    Moved(usize, Seen),
    /// The member refused (it answered: `true`) or did not answer.
    Failed(EtcdError, bool),
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint is not `http://HOST:PORT` (`https://` with TLS).
    #[error("etcd endpoint {0:?} is not http://HOST:PORT or https://HOST:PORT")]
    Endpoint(String),
    /// An `https://` endpoint, and no credentials to speak TLS with.
    #[error("etcd endpoint {0:?} is https: give the cluster's credentials (--credentials DIR)")]
    TlsNeeded(String),
    /// An `http://` endpoint beside credentials: it would be plain.
    #[error("etcd endpoint {0:?} is plain http, and the cluster's etcd speaks TLS: give https://")]
    PlainWithTls(String),
    /// The credentials for etcd's TLS cannot be read.
    #[error("etcd's TLS: {0}")]
    Tls(String),
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// The async runtime could not be made.
    #[error("cannot start etcd's client: {0}")]
    Runtime(String),
    /// etcd refused or did not answer in time (no quorum, unreachable).
    #[error("etcd at {endpoints}: {problem}")]
    Request { endpoints: String, problem: String },
}

/// A blocking client of one etcd cluster.
pub struct Etcd {
    endpoints: Endpoints,
    runtime: tokio::runtime::Runtime,
    /// A connection to each member, made on first use, and again after
    /// the member failed to answer.
    clients: Mutex<Vec<Option<Client>>>,
    /// The member asked first: the one that answered last.
    preferred: AtomicUsize,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Etcd({})", self.endpoints.joined())
    }
}

impl Etcd {
    /// A client of the cluster at `endpoints`; nothing is contacted yet.
    pub fn new(endpoints: Endpoints) -> Result<Etcd, EtcdError> {
        // One worker: the requests are few and small; `block_on` from any
        // thread hands its future to the runtime's own (the questions to
        // the members run on the worker).
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| EtcdError::Runtime(e.to_string()))?;
        let clients = Mutex::new(vec![None; endpoints.urls().len()]);
        Ok(Etcd { endpoints, runtime, clients, preferred: AtomicUsize::new(0) })
    }

    /// The endpoints, comma-separated, as messages name the cluster.
    pub fn endpoints(&self) -> String {
        self.endpoints.joined()
    }

    fn error(&self, problem: impl std::fmt::Display) -> EtcdError {
        EtcdError::Request { endpoints: self.endpoints(), problem: problem.to_string() }
    }

    /// The connection to member `i` (made if need be: etcd-client connects
    /// on the first request, so this does not wait on the member).
    async fn member(&self, i: usize) -> Result<Client, EtcdError> {
        if let Some(c) = &self.clients.lock().unwrap_or_else(|e| e.into_inner())[i] {
            return Ok(c.clone());
        }
        let url = self.endpoints.urls()[i].clone();
        let connect = Client::connect([url.clone()], Some(self.endpoints.options()));
        let client = match tokio::time::timeout(FIRST_TRY, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.error(format!("{url}: {e}"))),
            Err(_) => return Err(self.error(format!("{url} did not answer in time"))),
        };
        self.clients.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(client.clone());
        Ok(client)
    }

    /// Drops the connection to member `i`: the next use connects anew (a
    /// connection to a host that vanished would wait for TCP's timeout).
    fn forget(&self, i: usize) {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())[i] = None;
    }

    /// Asks every member who leads, again every [`PROBE_EVERY`], each in a
    /// task of its own (a silent member holds up nobody else's answer):
    /// the answers, as they come, on the receiver; the tasks end when the
    /// returned set is dropped.
    async fn probes(&self) -> (tokio::task::JoinSet<()>, tokio::sync::mpsc::UnboundedReceiver<(usize, Seen)>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..self.endpoints.urls().len() {
            let client = self.member(i).await.ok();
            let tx = tx.clone();
            set.spawn(async move {
                loop {
                    let seen = match client.clone() {
                        Some(mut c) => match tokio::time::timeout(PROBE, c.status()).await {
                            Ok(Ok(r)) => match (r.leader(), r.header().map(|h| h.member_id())) {
                                (0, _) => Seen::NoLeader,
                                (leader, Some(me)) if leader == me => Seen::Leads(me),
                                (leader, _) => Seen::Follows(leader),
                            },
                            Ok(Err(e)) if e.to_string().contains("no leader") => Seen::NoLeader,
                            _ => Seen::Silent,
                        },
                        None => Seen::Silent,
                    };
                    if tx.send((i, seen)).is_err() {
                        return;
                    }
                    tokio::time::sleep(PROBE_EVERY).await;
                }
            });
        }
        (set, rx)
    }

    /// What each member says of the leader, once, within `until`: stops
    /// early when one says it leads or all have answered.
    async fn survey(&self, until: Instant) -> Vec<Option<Seen>> {
        let mut seen = vec![None; self.endpoints.urls().len()];
        let (_tasks, mut rx) = self.probes().await;
        while let Ok(Some((i, s))) = tokio::time::timeout_at(until, rx.recv()).await {
            if seen[i].is_none() {
                seen[i] = Some(s);
                if s == Seen::Silent {
                    self.forget(i);
                }
            }
            if matches!(s, Seen::Leads(_)) || seen.iter().all(Option::is_some) {
                break;
            }
        }
        seen
    }

    /// Resolves once the leader changed while a try waits on member `on`
    /// (see [`moved`]), with the member that leads now and what it said;
    /// never otherwise. `known`: what `on` said just before the request
    /// was sent to it, if it was asked (else its first answer here stands
    /// for it: a leader elected in the first [`WATCH_AFTER`] of a try is
    /// then missed, and the try runs to its end).
    async fn leader_moved(&self, on: usize, known: Option<Seen>) -> (usize, Seen) {
        tokio::time::sleep(WATCH_AFTER).await;
        let mut seen = vec![None; self.endpoints.urls().len()];
        let mut start = known;
        let (_tasks, mut rx) = self.probes().await;
        while let Some((i, s)) = rx.recv().await {
            seen[i] = Some(s);
            if i == on && start.is_none() {
                start = Some(s);
            }
            if let Some((to, Some(said))) = start.and_then(|start| moved(start, &seen)).map(|to| (to, seen[to])) {
                return (to, said);
            }
        }
        std::future::pending().await
    }

    /// Runs one request, trying again until the deadline (see the module's
    /// doc for where each try goes): a member's death or a new leader's
    /// election fails a try or two, which is not yet "etcd cannot be
    /// reached". Each try has a bound of its own (growing, as a loaded
    /// member may be slow rather than gone). A retried write may have been
    /// applied by the try whose answer was lost or abandoned: each write
    /// here is a transaction that reads the same on a second try.
    fn request<T, F>(&self, f: impl Fn(Client) -> F) -> Result<T, EtcdError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let urls = self.endpoints.urls();
        let began = Instant::now();
        let deadline = began + REQUEST_TIMEOUT;
        // What happened, told in one line when it took more than one try.
        let mut story: Vec<String> = Vec::new();
        let result = self.runtime.block_on(async {
            let mut on = self.preferred.load(Ordering::Relaxed) % urls.len();
            // What `on` said when last asked, before this try.
            let mut known = None;
            let mut last = None;
            let mut tries = 0u32;
            while Instant::now() < deadline {
                tries += 1;
                let this_try = (Instant::now() + FIRST_TRY * tries).min(deadline);
                let outcome = match self.member(on).await {
                    Err(e) => Outcome::Failed(e, false),
                    Ok(client) => tokio::select! {
                        r = tokio::time::timeout_at(this_try, f(client)) => match r {
                            Ok(Ok(v)) => Outcome::Answered(v),
                            Ok(Err(e)) => Outcome::Failed(self.error(format!("{}: {e}", urls[on])), true),
                            Err(_) => Outcome::Failed(self.error(format!("{} did not answer in time", urls[on])), false),
                        },
                        (to, said) = self.leader_moved(on, known) => Outcome::Moved(to, said),
                    },
                };
                let at = began.elapsed().as_millis();
                match outcome {
                    Outcome::Answered(v) => {
                        self.preferred.store(on, Ordering::Relaxed);
                        if tries > 1 {
                            story.push(format!("answered by {} after {at} ms", urls[on]));
                        }
                        return Ok(v);
                    }
                    Outcome::Moved(to, said) => {
                        story.push(format!("{} leads now ({at} ms): sent there again", urls[to]));
                        on = to;
                        known = Some(said);
                    }
                    Outcome::Failed(e, answered) => {
                        story.push(format!(
                            "{} {} ({at} ms)",
                            urls[on],
                            if answered { "refused" } else { "did not answer" }
                        ));
                        if !answered {
                            self.forget(on);
                        }
                        last = Some(e);
                        let seen = self.survey((Instant::now() + PROBE).min(deadline)).await;
                        let next = next_after(on, &seen);
                        // No leader yet (an election): a pause, then try.
                        if !matches!(seen[next], Some(Seen::Leads(_))) {
                            tokio::time::sleep(RETRY).await;
                        }
                        on = next;
                        known = seen[next];
                    }
                }
            }
            // The next request starts where this one would have gone on.
            self.preferred.store(on, Ordering::Relaxed);
            Err(last.unwrap_or_else(|| self.error("no answer within the request timeout (no quorum?)")))
        });
        if !story.is_empty() && result.is_ok() {
            eprintln!("ftvm: etcd: {}", story.join("; "));
        }
        result
    }

    /// The value at `key`, if there is one.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let key = key.to_string();
        let resp = self.request(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The value at `key` and its modification revision (for a
    /// transaction that writes only if nobody wrote since), if there is one.
    pub fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, EtcdError> {
        let key = key.to_string();
        let resp = self.request(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(resp.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// The keys and values under `prefix`, sorted by key; at most `limit`
    /// of them from the end when `last` (0: all).
    pub fn get_prefix(&self, prefix: &str, last: i64) -> Result<Vec<(String, Vec<u8>)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move {
                let mut opts = GetOptions::new().with_prefix();
                if last > 0 {
                    opts =
                        opts.with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Descend).with_limit(last);
                }
                c.get(prefix, Some(opts)).await
            }
        })?;
        let mut out: Vec<(String, Vec<u8>)> =
            resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect();
        out.sort();
        Ok(out)
    }

    /// The keys, values and modification revisions under `prefix` written
    /// after revision `after`, in the order they were written.
    pub fn get_prefix_since(&self, prefix: &str, after: i64) -> Result<Vec<(String, Vec<u8>, i64)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move {
                let opts = GetOptions::new().with_prefix().with_min_mod_revision(after + 1);
                c.get(prefix, Some(opts)).await
            }
        })?;
        let mut out: Vec<(String, Vec<u8>, i64)> = resp
            .kvs()
            .iter()
            .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec(), kv.mod_revision()))
            .collect();
        out.sort_by_key(|(_, _, r)| *r);
        Ok(out)
    }

    /// The keys under `prefix` and their modification revisions, without
    /// their values (for deciding what to delete).
    pub fn keys_prefix(&self, prefix: &str) -> Result<Vec<(String, i64)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move { c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await }
        })?;
        Ok(resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.mod_revision())).collect())
    }

    /// Runs a transaction.
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse, EtcdError> {
        self.request(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_try_moves_only_to_a_new_leader() {
        // The member asked followed 7, which still leads: stay.
        assert_eq!(moved(Seen::Follows(7), &[Some(Seen::Follows(7)), Some(Seen::Leads(7)), None]), None);
        assert_eq!(moved(Seen::Leads(7), &[Some(Seen::Leads(7)), None, Some(Seen::Follows(7))]), None);
        // It followed 7, and 9 leads now (7 died): there, even when 9 is
        // the member asked (it forwarded the request to 7 before).
        assert_eq!(
            moved(Seen::Follows(7), &[Some(Seen::Follows(9)), Some(Seen::Leads(9)), Some(Seen::Silent)]),
            Some(1)
        );
        assert_eq!(moved(Seen::Follows(7), &[Some(Seen::Leads(9)), Some(Seen::Follows(9)), None]), Some(0));
        // The survivors still name the dead leader: nothing to move to yet.
        assert_eq!(moved(Seen::Silent, &[Some(Seen::Silent), Some(Seen::Follows(7)), Some(Seen::Follows(7))]), None);
        // It did not answer, or had no leader: any leader.
        assert_eq!(moved(Seen::Silent, &[Some(Seen::Silent), Some(Seen::Follows(9)), Some(Seen::Leads(9))]), Some(2));
        assert_eq!(moved(Seen::NoLeader, &[Some(Seen::Leads(3)), None, None]), Some(0));
    }

    #[test]
    fn a_failed_try_goes_to_the_leader_else_a_member_that_answers() {
        let (l, f, n, s) = (Some(Seen::Leads(1)), Some(Seen::Follows(1)), Some(Seen::NoLeader), Some(Seen::Silent));
        assert_eq!(next_after(0, &[s, f, l]), 2);
        assert_eq!(next_after(0, &[l, f, s]), 0, "the member that failed, if it alone leads");
        assert_eq!(next_after(0, &[s, s, f]), 2);
        assert_eq!(next_after(1, &[f, s, f]), 2, "the next in turn among equals");
        assert_eq!(next_after(2, &[n, s, s]), 0);
        // Never a silent member over one that answered, even the one that failed.
        assert_eq!(next_after(0, &[n, s, s]), 0);
        // Nobody answered: the next in turn.
        assert_eq!(next_after(0, &[s, None, s]), 1);
        assert_eq!(next_after(2, &[None, None, None]), 0);
    }
}
