//! `ftvm agent` and `ftvm cluster` on one host (issue 29 item 1), against a
//! real etcd (Debian's etcd-server, started here on loopback, speaking TLS
//! and asking for client certificates, as a cluster's does): the agent
//! records its host under a lease, serves only HTTPS, refuses a request
//! without the cluster's token, and etcd refuses a client without a
//! certificate of the cluster's authority; the agent runs a VM from a spec (the default guest, which prints what its
//! command says), reports it in its API, the command line and its
//! Prometheus metrics (checked by `promtool check metrics`), refuses a
//! bad spec in one line, stops the VM, and on SIGTERM withdraws its host.
//! Needs the built image (`make image`).

mod common;

use common::{run_with_timeout, Scratch};
use ftvm_cluster::authority::credentials::Credentials;
use ftvm_cluster::client::{AgentApi, AgentClient, ClientError};
use ftvm_cluster::model::{ApiError, Role, VmInfo};
use ftvm_etcd::local::LocalEtcd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FTVM: &str = env!("CARGO_BIN_EXE_ftvm");
/// A boot takes under a minute on a busy 2-core host; past this it is a hang.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

fn cluster(etcd: &str, credentials: &str, args: &[&str]) -> common::Run {
    let mut cmd = Command::new(FTVM);
    cmd.args(["cluster", "--etcd", etcd, "--credentials", credentials]).args(args);
    run_with_timeout(cmd, Duration::from_secs(120))
}

/// `ftvm cluster ARGS` that must succeed (init, issue).
fn cluster_ok(args: &[&str]) {
    let mut cmd = Command::new(FTVM);
    cmd.arg("cluster").args(args);
    let r = run_with_timeout(cmd, Duration::from_secs(30));
    assert!(r.status.is_some_and(|s| s.success()), "ftvm cluster {args:?}: {}", r.stderr);
}

/// Polls `f` every 200 ms until it gives Some, or panics naming `what`.
fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < within, "{what} did not happen within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn an_agent_records_its_host_runs_a_vm_and_withdraws_on_sigterm() {
    let scratch = Scratch::new("agent", "one");
    // The cluster's authority, the host's credentials (its agent's and
    // etcd member's), an operator's.
    let path = |p: &str| scratch.path(p).to_str().unwrap().to_string();
    cluster_ok(&["init", &path("ca")]);
    cluster_ok(&["issue", &path("ca"), &path("h1"), "--name", "h1", "--ip", "127.0.0.1"]);
    cluster_ok(&["issue", &path("ca"), &path("admin"), "--name", "admin"]);
    let admin = &path("admin");
    let etcd = LocalEtcd::start_with(1, &scratch.path("etcd"), Some(&scratch.path("h1"))).unwrap();
    let endpoints = etcd.endpoints();
    assert!(endpoints.starts_with("https://"), "{endpoints}");
    let credentials = Credentials::read(&scratch.path("admin")).unwrap();
    let port = free_port();
    let agent = Agent(
        Command::new(FTVM)
            .args(["agent", "--host-id", "h1", "--etcd", &endpoints, "--address", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--credentials", &path("h1")])
            .arg("--state-dir")
            .arg(scratch.path("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(scratch.path("agent.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    // The host, in etcd, as the command line lists it.
    let hosts = wait_for("the host's record", Duration::from_secs(60), || {
        let r = cluster(&endpoints, admin, &["--json", "host", "list"]);
        let hosts: Vec<serde_json::Value> = serde_json::from_str(&r.stdout).ok()?;
        (!hosts.is_empty()).then_some(hosts)
    });
    assert_eq!(hosts[0]["id"], "h1");
    assert_eq!(hosts[0]["api"], format!("https://127.0.0.1:{port}"));
    assert!(hosts[0]["memory_bytes"].as_u64().unwrap() > 1 << 30, "{hosts:?}");

    // A stranger is refused, with the API's typed error.
    let api = format!("https://127.0.0.1:{port}");
    let stranger = AgentClient::new(&api, &credentials.with_token("not-the-cluster-token-at-all"));
    assert!(matches!(stranger.vms(), Err(ClientError::Api(ApiError::Unauthorized(_)))));
    let client = AgentClient::new(&api, &credentials);
    // Plain HTTP gets no answer of the API's (the token would travel in
    // clear): the port speaks only TLS.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    std::io::Write::write_all(&mut plain, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut plain, &mut answer);
    assert!(!answer.starts_with(b"HTTP/"), "plain HTTP answered: {:?}", String::from_utf8_lossy(&answer));
    // etcd (which holds the pairs' keys) refuses a client with no
    // certificate, and one whose certificate another authority signed.
    let no_cert = run_with_timeout(
        {
            let mut c = Command::new("etcdctl");
            c.args(["--endpoints", &endpoints, "--cacert", &path("h1/ca.pem"), "--command-timeout=5s"]);
            c.args(["get", "--prefix", "/ftvm/"]);
            c
        },
        Duration::from_secs(60),
    );
    assert!(!no_cert.status.is_some_and(|s| s.success()), "etcd answered a client without a certificate");
    cluster_ok(&["init", &path("other-ca")]);
    cluster_ok(&["issue", &path("other-ca"), &path("intruder"), "--name", "intruder"]);
    // The intruder trusts the cluster's authority (its certificate is no
    // secret): only its own certificate is wrong, and etcd must see it.
    std::fs::copy(scratch.path("h1/ca.pem"), scratch.path("intruder/ca.pem")).unwrap();
    let intruder = cluster(&endpoints, &path("intruder"), &["host", "list"]);
    assert_eq!(intruder.status.and_then(|s| s.code()), Some(1), "{} {}", intruder.stdout, intruder.stderr);
    assert_eq!(intruder.stderr.lines().count(), 1, "{}", intruder.stderr);
    // (Its one line names etcd's TLS alert or, when etcd closes first, a
    // broken pipe: TLS 1.3 checks the client's certificate after the
    // client thinks the handshake done. The operator's credentials, which
    // differ only in the certificate, are taken: below.)

    // A VM from a spec; its guest runs the command.
    let r = cluster(
        &endpoints,
        admin,
        &["vm", "create", "v1", "--on", "h1", "--memory", "256", "--command", "echo agent-vm-says-hello; sleep 900"],
    );
    assert!(r.status.is_some_and(|s| s.success()), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.starts_with("v1 created on h1"), "{}", r.stdout);
    let console = scratch.path("state/vms/v1/console.log");
    wait_for("the guest's command", BOOT_TIMEOUT, || {
        std::fs::read_to_string(&console).ok().filter(|c| c.contains("agent-vm-says-hello"))
    });
    let info: VmInfo = client.vm("v1").unwrap();
    assert_eq!((info.role, info.host.as_str()), (Role::Unprotected, "h1"));
    assert!(info.status.is_some(), "{info:?}");
    // The host's record names it, as etcd has it.
    wait_for("the VM in the host's record", Duration::from_secs(30), || {
        let r = cluster(&endpoints, admin, &["host", "list"]);
        r.stdout.contains("v1:unprotected").then_some(())
    });
    let list = cluster(&endpoints, admin, &["vm", "list"]);
    assert!(
        list.stdout.lines().any(|l| l.starts_with("v1") && l.contains("h1") && l.contains("unprotected")),
        "{}",
        list.stdout
    );

    // The host's lease lost (as when the agent could not reach etcd for
    // longer than the lease: revoked here) while its record changes (a
    // VM started through the agent's own API): the record comes back,
    // under a new lease, with the change.
    let etcdctl = |args: &[&str]| {
        let mut c = Command::new("etcdctl");
        c.args(["--endpoints", &endpoints, "--command-timeout=5s"]);
        c.args(["--cacert", &path("admin/ca.pem"), "--cert", &path("admin/cert.pem"), "--key", &path("admin/key.pem")]);
        c.args(args);
        let r = run_with_timeout(c, Duration::from_secs(60));
        assert!(r.status.is_some_and(|s| s.success()), "etcdctl {args:?}: {}", r.stderr);
        r.stdout
    };
    let got: serde_json::Value = serde_json::from_str(&etcdctl(&["get", "/ftvm/hosts/h1", "-w", "json"])).unwrap();
    let lease = got["kvs"][0]["lease"].as_i64().expect("the host's record is under a lease");
    etcdctl(&["lease", "revoke", &format!("{lease:x}")]);
    let mut second = info.spec.clone();
    second.name = "v2".into();
    client.create(&second).unwrap();
    wait_for("the host's record back with v2", Duration::from_secs(60), || {
        let r = cluster(&endpoints, admin, &["host", "list"]);
        r.stdout.contains("v2:").then_some(())
    });
    client.delete("v2").unwrap();

    // Metrics a Prometheus server takes.
    let metrics = client.metrics().unwrap();
    assert!(metrics.contains(r#"ftvm_vm_info{vm="v1",role="unprotected",mode="none"} 1"#), "{metrics}");
    assert!(metrics.contains("ftvm_host_vms 1"), "{metrics}");
    // Counted from the cluster's event log: nothing went live yet.
    assert!(metrics.contains(r#"ftvm_vm_failovers{vm="v1"} 0"#), "{metrics}");
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut promtool = promtool.expect("promtool (Debian's prometheus) is installed by scripts/install-deps.sh");
    std::io::Write::write_all(promtool.stdin.as_mut().unwrap(), metrics.as_bytes()).unwrap();
    drop(promtool.stdin.take());
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // A bad spec, a second VM of the same name: refused in one line.
    let bad = cluster(&endpoints, admin, &["vm", "create", "no/slash", "--on", "h1"]);
    assert_eq!(bad.status.and_then(|s| s.code()), Some(1), "{}", bad.stderr);
    assert_eq!(bad.stderr.lines().count(), 1, "{}", bad.stderr);
    assert!(bad.stderr.contains("is not a VM name"), "{}", bad.stderr);
    let again = cluster(&endpoints, admin, &["vm", "create", "v1", "--on", "h1"]);
    assert!(again.stderr.contains("VM v1 exists already in the cluster"), "{}", again.stderr);
    assert_eq!(again.stderr.lines().count(), 1, "{}", again.stderr);
    // A host with too little memory free for it: refused at once.
    let big = cluster(&endpoints, admin, &["vm", "create", "big", "--on", "h1", "--memory", "65536"]);
    assert_eq!(big.status.and_then(|s| s.code()), Some(1), "{}", big.stderr);
    assert!(big.stderr.contains("too little for VM big's 65536 MiB"), "{}", big.stderr);
    assert_eq!(big.stderr.lines().count(), 1, "{}", big.stderr);
    // ... and by the agent itself, whoever asks it (its record can be a
    // moment old: two placements in one pass, two clients at once).
    let mut spec = info.spec.clone();
    spec.name = "big".into();
    spec.memory_mib = 65536;
    match client.create(&spec) {
        Err(ClientError::Api(ApiError::Conflict(m))) => assert!(m.contains("VM big needs 65536 MiB"), "{m}"),
        other => panic!("a VM bigger than the host was not refused as a conflict: {other:?}"),
    }

    // Stopped: its guest powers off (SIGTERM to its ftvm), and it is gone.
    let del = cluster(&endpoints, admin, &["vm", "delete", "v1"]);
    assert!(del.status.is_some_and(|s| s.success()), "{} {}", del.stdout, del.stderr);
    assert!(del.stdout.contains("VM v1 stopped"), "{}", del.stdout);
    assert!(matches!(client.vm("v1"), Err(ClientError::Api(ApiError::NotFound(_)))));

    // SIGTERM: the agent withdraws its host and exits 0.
    let mut agent = agent;
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = wait_for("the agent's exit", Duration::from_secs(60), || agent.0.try_wait().unwrap());
    assert!(status.success(), "{status:?}: {}", std::fs::read_to_string(scratch.path("agent.log")).unwrap());
    let r = cluster(&endpoints, admin, &["--json", "host", "list"]);
    assert_eq!(r.stdout.trim(), "[]", "the host's record outlived its agent: {}", r.stdout);
    drop(etcd);
}
