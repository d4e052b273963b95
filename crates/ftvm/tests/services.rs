//! A Debian server as apt would install it (issue 63): an image of
//! PostgreSQL, nginx and openssh-server built with `ftvm image build`, run
//! with `ftvm run --image` on a TAP in a namespace made by the test, and
//! used from the host as a user would, with no step inside the guest: psql
//! answers, curl gets nginx's page, ssh logs in with the image's key and
//! with the run's, and the VM has the host name its seed gives it.
//!
//! The image is built into the user's cache under a name of the tests' own
//! (`ftvm-test-web`), with its key pair and added files kept beside it
//! (`ftvm-test-web-files`), so a second run finds it built (a build configures some 180 packages in the guest: minutes).
//! Needs root (namespaces, TAP), ssh, psql and curl on the host.

mod common;

use common::net::*;
use common::Scratch;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const IMAGE: &str = "ftvm-test-web";
/// A build configures every package in the guest: minutes on a quiet
/// host, more on a loaded one.
const BUILD_LIMIT: Duration = Duration::from_secs(3600);

/// PostgreSQL's client authentication for the test: the host's network
/// (10.200.0.0/24) may log in as anyone (the package's own file allows
/// only the guest). In files of their own: the FT tests build the same
/// image (harness/ftsite/host.py's web_image) and must give the same spec.
const PG_HBA: &str = include_str!("data/web-image/pg_hba.conf");
const PG_LISTEN: &str = include_str!("data/web-image/listen.conf");

/// An ed25519 key pair made with ssh-keygen at `dir/name` unless it is there.
fn key_pair(dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join(name);
    if !key.exists() {
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key)
            .output()
            .expect("ssh-keygen (Debian package openssh-client)");
        assert!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    key
}

/// Writes `text` at `path` unless it holds it already: the image's spec
/// digests its added files' times, so a file written again would make the
/// cached image out of date.
fn keep_file(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).unwrap();
    }
}

/// `ftvm image build --name ftvm-test-web --packages postgresql,nginx,openssh-server --ssh-key KEY --add DIR:/etc/postgresql/17/main`
/// as a user would type it; cached when built before from the same spec.
/// harness/ftsite/host.py's web_image builds it with the same command
/// (change both together, or each rebuilds the other's image).
fn build_image(key: &Path, fixtures: &Path) {
    let pg = fixtures.join("postgresql");
    keep_file(&pg.join("pg_hba.conf"), PG_HBA);
    keep_file(&pg.join("conf.d/listen.conf"), PG_LISTEN);
    let mut c = Command::new(ftvm());
    c.args(["image", "build", "--name", IMAGE, "--packages", "postgresql,nginx,openssh-server", "--size", "4G"])
        .arg("--ssh-key")
        .arg(key.with_extension("pub"))
        .arg("--add")
        .arg(format!("{}:/etc/postgresql/17/main", pg.display()));
    let started = Instant::now();
    let out = common::run_with_timeout(c, BUILD_LIMIT);
    assert_eq!(out.status.and_then(|s| s.code()), Some(0), "ftvm image build: {}", out.stderr);
    eprintln!("ftvm image build --name {IMAGE}: {:.0} s", started.elapsed().as_secs_f64());
}

/// A command in the test's namespace, with its status and output.
fn in_ns(ns: &Netns, program: &str, args: &[&str]) -> (bool, String) {
    let out = ns.command(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn ssh(ns: &Netns, key: &Path, command: &str) -> (bool, String) {
    ssh_as(ns, "root", key, command)
}

fn ssh_as(ns: &Netns, user: &str, key: &Path, command: &str) -> (bool, String) {
    let key = key.to_str().unwrap();
    let target = format!("{user}@{GUEST_IP}");
    in_ns(
        ns,
        "ssh",
        &[
            "-i",
            key,
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            &target,
            command,
        ],
    )
}

/// Polls `check` until it holds, the VM still running; fails after `limit`.
fn wait_until(vm: &mut Vm, what: &str, limit: Duration, mut check: impl FnMut() -> (bool, String)) -> String {
    let started = Instant::now();
    loop {
        vm.assert_running();
        let (ok, text) = check();
        if ok {
            eprintln!("{what}: after {:.1} s", started.elapsed().as_secs_f64());
            return text;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?} (last: {text}); VM output:\n{}", vm.log());
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn postgresql_nginx_and_ssh_answer_from_an_image_with_no_step_in_the_guest() {
    let cache = ftvm_image::cache_dir();
    let fixtures = cache.join(format!("{IMAGE}-files"));
    let image_key = key_pair(&fixtures, "id_ed25519");
    let scratch = Scratch::new("services-test", "web");
    build_image(&image_key, &fixtures);
    // A second key, given to this run only (its seed), and a host name.
    let run_key = key_pair(&scratch.dir, "run_key");

    let ns = Netns::new("w");
    let append = format!("console=ttyS0 root=/dev/vda rw ftvm.ip={GUEST_IP}/24");
    let run_pub = run_key.with_extension("pub");
    let mut vm = Vm::start(
        &ns,
        &[
            "run",
            "--image",
            IMAGE,
            "--mem",
            "1G",
            "--net",
            "tap=t0",
            "--append",
            &append,
            "--hostname",
            "db1",
            "--ssh-key",
            run_pub.to_str().unwrap(),
            "--user",
            &format!("alice:{}:adm,wheel", run_pub.display()),
        ],
        scratch.path("vm.log"),
    );

    let pg = ["-h", GUEST_IP, "-U", "postgres", "-tAc", "select 6 * 7"];
    let answer = wait_until(&mut vm, "psql answers", BOOT_TIMEOUT, || in_ns(&ns, "psql", &pg));
    assert_eq!(answer.trim(), "42");

    let url = format!("http://{GUEST_IP}/");
    let page = wait_until(&mut vm, "nginx answers", Duration::from_secs(120), || {
        in_ns(&ns, "curl", &["-sS", "--max-time", "10", &url])
    });
    assert!(page.contains("Welcome to nginx"), "nginx's page: {page}");

    let arch =
        wait_until(&mut vm, "ssh with the image's key", Duration::from_secs(120), || ssh(&ns, &image_key, "uname -m"));
    assert_eq!(arch.trim(), "riscv64");
    let (ok, name) = ssh(&ns, &run_key, "hostname");
    assert!(ok && name.trim() == "db1", "ssh with the run's key, the seed's host name: {name}");
    // The seed's account: made at boot, in the group the image has (adm;
    // Debian has no wheel), its key its own, no password.
    let (ok, alice) =
        ssh_as(&ns, "alice", &run_key, "id -un; id -nG; echo $HOME; stat -c '%U %a' .ssh/authorized_keys");
    assert!(ok, "ssh as the seed's user: {alice}");
    assert_eq!(alice, "alice\nalice adm\n/home/alice\nalice 600\n", "the seed's user");
    let (ok, shadow) = ssh(&ns, &image_key, "getent shadow alice | cut -d: -f2");
    assert!(ok && shadow.trim() == "*", "alice's password field: {shadow}");

    // What systemd says: the services the packages enable run, nothing
    // failed, and the host keys are this VM's own (made at its first boot).
    let (_, state) = ssh(&ns, &image_key, "systemctl is-system-running --wait; systemctl --failed --no-legend");
    assert!(state.starts_with("running"), "systemctl is-system-running: {state}");
    let (ok, active) = ssh(&ns, &image_key, "systemctl is-active postgresql@17-main nginx ssh redis-server");
    assert!(ok, "services: {active}");
    let (ok, users) =
        ssh(&ns, &image_key, "id -u postgres && id -u www-data && ls /etc/ssl/private/ssl-cert-snakeoil.key");
    assert!(ok, "what the maintainer scripts made: {users}");
}
