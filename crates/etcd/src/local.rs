//! A cluster of real etcd members (Debian's `etcd` binary) on this host's
//! loopback, each in a data directory of its own, for the tests: started,
//! stopped and restarted one member at a time (to take the quorum away and
//! give it back) or frozen (a host that vanished), and all stopped when
//! dropped. They run with the cluster's timing ([`TUNING`]). Plain, or
//! speaking TLS with client certificates as a cluster's etcd does (a
//! credentials directory whose certificate names 127.0.0.1).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// etcd's timing as the project runs it (harness/ftsite/etcd.py, the
/// README): a heartbeat every 100 ms and an election after 1000 ms without
/// one (etcd's defaults, given here so that they are a choice), and
/// pre-vote, so a member that was cut off and comes back cannot depose a
/// working leader (etcd 3.4's default is off). docs/ARCHITECTURE.md ("The
/// arbiter's store") says why not a shorter election timeout.
pub const TUNING: [&str; 5] = ["--heartbeat-interval", "100", "--election-timeout", "1000", "--pre-vote"];

/// One member: its name, ports and process (None while stopped).
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A local etcd cluster.
pub struct LocalEtcd {
    dir: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    /// The credentials directory the members' TLS is made of, if any.
    tls: Option<PathBuf>,
}

/// A port free on loopback now (the kernel's choice; released at once,
/// so it may rarely be taken again before etcd binds it).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalEtcd {
    /// Starts `n` members under `dir` (made if need be) and waits until
    /// the cluster answers. Err: the reason in one line (no `etcd` binary:
    /// install Debian's etcd-server).
    pub fn start(n: usize, dir: &Path) -> Result<LocalEtcd, String> {
        LocalEtcd::start_with(n, dir, None)
    }

    /// The same; with `tls`, the credentials directory whose `cert.pem`
    /// and `key.pem` the members serve and peer with, and whose `ca.pem`
    /// signs every client's certificate (which they require).
    pub fn start_with(n: usize, dir: &Path, tls: Option<&Path>) -> Result<LocalEtcd, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let mut members = Vec::new();
        for i in 0..n {
            let ports = (free_port(), free_port());
            let (Ok(client_port), Ok(peer_port)) = ports else {
                return Err("cannot find a free port on loopback".into());
            };
            members.push(Member { name: format!("m{i}"), client_port, peer_port, process: None });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={scheme}://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster =
            LocalEtcd { dir: dir.to_path_buf(), members, initial_cluster, tls: tls.map(Path::to_path_buf) };
        for i in 0..n {
            cluster.start_member(i)?;
        }
        cluster.wait_ready(Duration::from_secs(60))?;
        Ok(cluster)
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The client endpoints, comma-separated.
    pub fn endpoints(&self) -> String {
        let scheme = self.scheme();
        self.members.iter().map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port)).collect::<Vec<_>>().join(",")
    }

    /// The endpoints, with the TLS a client needs.
    pub fn client_endpoints(&self) -> Result<crate::Endpoints, String> {
        let tls = match &self.tls {
            Some(dir) => Some(crate::EtcdTls::from_dir(dir).map_err(|e| e.to_string())?),
            None => None,
        };
        crate::Endpoints::parse(&self.endpoints(), tls).map_err(|e| e.to_string())
    }

    /// Starts member `i` (again), with the data it had.
    pub fn start_member(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        if m.process.is_some() {
            return Ok(());
        }
        let data = self.dir.join(&m.name);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| format!("cannot write etcd's log in {}: {e}", self.dir.display()))?;
        let scheme = self.scheme();
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("{scheme}://127.0.0.1:{}", m.peer_port);
        let mut etcd = Command::new("etcd");
        if let Some(tls) = &self.tls {
            let (cert, key, ca) = (tls.join("cert.pem"), tls.join("key.pem"), tls.join("ca.pem"));
            etcd.arg("--cert-file").arg(&cert).arg("--key-file").arg(&key).arg("--trusted-ca-file").arg(&ca);
            etcd.arg("--client-cert-auth");
            etcd.arg("--peer-cert-file").arg(&cert).arg("--peer-key-file").arg(&key);
            etcd.arg("--peer-trusted-ca-file").arg(&ca).arg("--peer-client-cert-auth");
        }
        let child = etcd
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster, "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "ftvm-local"])
            .args(TUNING)
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "etcd not found on the host: install Debian's etcd-server (scripts/install-deps.sh)".to_string()
                }
                _ => format!("cannot start etcd: {e}"),
            })?;
        self.members[i].process = Some(child);
        Ok(())
    }

    /// Stops member `i` at once (SIGKILL), as a crash would.
    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    /// Freezes member `i` (SIGSTOP): its connections stay open and it
    /// answers nothing, as a host that vanished (no FIN, no RST).
    pub fn freeze_member(&mut self, i: usize) {
        self.signal_member(i, libc::SIGSTOP);
    }

    /// Lets a frozen member `i` run on (SIGCONT).
    pub fn thaw_member(&mut self, i: usize) {
        self.signal_member(i, libc::SIGCONT);
    }

    fn signal_member(&self, i: usize, signal: libc::c_int) {
        if let Some(p) = &self.members[i].process {
            // SAFETY: kill(2) on our own child's pid (not yet waited for,
            // so not reused); no memory is passed.
            unsafe {
                libc::kill(p.id() as libc::pid_t, signal);
            }
        }
    }

    /// The client URL of member `i`.
    pub fn member_endpoint(&self, i: usize) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.members[i].client_port)
    }

    /// Waits until a write succeeds through the client endpoints.
    pub fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let etcd = crate::Etcd::new(self.client_endpoints()?).map_err(|e| e.to_string())?;
        let until = Instant::now() + within;
        loop {
            let txn = etcd_client::Txn::new().and_then([etcd_client::TxnOp::put("/ftvm/ready", "", None)]);
            match etcd.txn(txn) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > until => {
                    return Err(format!("the local etcd cluster did not come up (logs in {}): {e}", self.dir.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A frozen member dies of SIGKILL all the same.
            self.kill_member(i);
        }
    }
}
