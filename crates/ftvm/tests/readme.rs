//! The README's examples as a person runs them (issue 32: "the README's
//! examples still work as written"). The commands are read from README.md's
//! ```sh block under "## Using it", at run time, so a README that changes
//! into something that does not work fails here. Every command line of the
//! block is classified in the lists below: run as written ([`AS_WRITTEN`]),
//! run with a stated change ([`INSTEAD`]: a placeholder such as `...`, a
//! command the guest does not have), or not run, with why ([`NOT_RUN`]:
//! those that need a second host, a cluster's etcd or a TAP). A line in
//! none of them (a new example) fails the test until it is classified; a
//! listed line the README no longer has fails it too, so the lists stay
//! true.
//!
//! The examples run in three groups at once ([`Group`]), each group in
//! README order, each example through `sh -c` (or, for an
//! interactive console or a signal, as a child of its own) with `ftvm` on
//! PATH, in a scratch directory, and each is checked for what a user sees
//! (`uname -m` prints riscv64, `wc -c` prints 5, a restored VM's shell
//! answers, a replay shows the recorded output). Paths the README gives
//! under `/tmp/`, `/etc/`, `/run/` and `/usr/local/share/man/man1` are
//! moved into the scratch directory (the only change to an example run as
//! written): the test must not write the host's system directories. The
//! image cache is a scratch one too (`FTVM_CACHE_DIR`), holding a copy of
//! the built default image and the real cache's downloaded packages, since
//! the examples write an image (`--persist`), build one and remove it.
//!
//! Needs the built default image (`make image`) and, for `ftvm image build
//! --name py`, root and the Debian mirror (about two minutes; its packages
//! are kept in the real cache's `debs/` for the next run).

mod common;

use common::Scratch;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A boot takes under a minute on a busy 2-core host; an image build a few.
const LIMIT: Duration = Duration::from_secs(900);
const PROMPT: &str = "root@ftvm-guest:~# ";

/// Run exactly as the README writes them (paths moved into the scratch
/// directory, as the module's doc says).
const AS_WRITTEN: &[&str] = &[
    "ftvm image build",
    "ftvm image path",
    "ftvm run",
    "ftvm run --persist",
    "ftvm image build --name py --packages python3,sqlite3 --size 4G --add ./app:/opt/app",
    "ftvm run --image py --exec 'python3 /opt/app/main.py'",
    "ftvm image list",
    "ftvm image path py",
    "ftvm image rm py",
    "ftvm run --exec 'uname -m'",
    "echo data | ftvm run --exec 'wc -c'",
    "ftvm run --stop-timeout 60",
    "ftvm --version",
    "ftvm list",
    "ftvm completions bash > /etc/bash_completion.d/ftvm",
    "ftvm man > ftvm.1; ftvm man --dir /usr/local/share/man/man1",
    "ftvm run --cpus 2 --mem 2G --disk root.ext4 --disk data.img --disk ro.img,readonly",
    "ftvm run --bios none --kernel prog.elf",
    "ftvm control /tmp/vm.sock pause",
    "ftvm control /tmp/vm.sock snapshot /tmp/vm.snap",
    "ftvm control /tmp/vm.sock quit",
    "ftvm run --restore /tmp/vm.snap",
    "ftvm record --log /tmp/vm.log --exec 'head -c 16 /dev/urandom | od -x'",
    "ftvm replay --log /tmp/vm.log --show-console",
    "ftvm ft keygen /etc/ftvm/pair.key",
    "ftvm cluster init /etc/ftvm/authority",
    "ftvm cluster issue /etc/ftvm/authority /etc/ftvm/host-a --name a --ip 10.0.0.1",
    "ftvm cluster issue /etc/ftvm/authority /etc/ftvm/alice --name alice",
];

/// Run with a change: (the README's line, what runs instead, why).
const INSTEAD: &[(&str, &str, &str)] = &[
    (
        "ftvm run --exec 'make check' --exec-timeout 3600",
        "ftvm run --exec 'sleep 600' --exec-timeout 5",
        "the guest has no make and no project to check, and an hour is too long to wait: the same options \
         with a command that outlives a shorter limit (exit status 124)",
    ),
    ("ftvm --log-level debug run ...", "ftvm --log-level debug run --exec true", "`...` stands for a run's options"),
    (
        "ftvm run --control /tmp/vm.sock ...",
        "ftvm run --control /tmp/vm.sock",
        "`...` stands for the VM's options; the default guest needs none",
    ),
    (
        "ftvm replay --log /tmp/vm.log --then-run",
        "ftvm replay --log /tmp/live.log --then-run",
        "the recording above ends with its guest powered off, where there is nothing to run on (ftvm says so, \
         exit status 1): an interactive recording ended by SIGINT (as Ctrl-C in its terminal) is replayed instead",
    ),
    (
        "ftvm control /run/vm.sock status",
        "ftvm control /run/vm.sock status",
        "the README shows it on a pair's primary; a VM alone started here with --control /run/vm.sock answers it",
    ),
    ("ftvm control --json /run/vm.sock status", "ftvm control --json /run/vm.sock status", "on a VM alone, as above"),
    (
        "ftvm control /run/vm.sock snapshot vm.snap",
        "ftvm control /run/vm.sock snapshot vm.snap",
        "on a VM alone, as above",
    ),
];

const SERVICES: &str = "needs a TAP and builds an image of some 180 packages: crates/ftvm/tests/services.rs runs these \
     (its own image name and key, a TAP in a namespace; psql, curl and ssh from the host)";
const SECOND_HOST: &str = "needs a second host (a backup listening, or a pair to act on)";
const CLUSTER: &str = "needs a cluster: etcd on the hosts and an agent on each";
const TAP: &str = "needs a TAP device and an address on it on the host (CAP_NET_ADMIN)";

/// Not run: (the README's line, why).
const NOT_RUN: &[(&str, &str)] = &[
    (
        "ftvm image build --name web --packages postgresql,nginx,openssh-server --ssh-key ~/.ssh/id_ed25519.pub",
        SERVICES,
    ),
    (
        "ftvm run --image web --net tap=tap0 --append 'console=ttyS0 root=/dev/vda rw ftvm.ip=10.0.0.2/24' --hostname db1 \
         --user alice:alice.pub:sudo",
        SERVICES,
    ),
    ("ssh root@10.0.0.2 systemctl status postgresql", SERVICES),
    ("ftvm console /tmp/vm.sock", "an interactive terminal on a running VM: crates/ftvm/tests/console.rs attaches, types, watches and detaches as a person does"),
    (
        "ftvm run --net tap=tap0 --append 'console=ttyS0 root=/dev/vda rw ftvm.ip=10.0.0.2/24' \
         --exec 'redis-server /etc/redis/redis.conf'",
        TAP,
    ),
    ("redis-cli -h 10.0.0.2 set hello world", TAP),
    ("ftvm ft backup --listen 10.0.0.2:7700 --shared /mnt/shared --net tap=t0,bridge=br0", SECOND_HOST),
    ("ftvm ft primary --backup 10.0.0.2:7700 --shared /mnt/shared --net tap=t0,bridge=br0", SECOND_HOST),
    (
        "ftvm console /run/vm.sock",
        "needs a second host: harness/tests/test_ft_services.py types on a pair's primary's console, then, after \
         a failover, on the backup's by its own control socket",
    ),
    ("ftvm control /run/vm.sock events", SECOND_HOST),
    ("ftvm control /run/vm.sock handover", SECOND_HOST),
    (
        "ftvm control /run/vm.sock protect --backup 10.0.0.2:7700 --shared /mnt/shared [--mode epoch|checkpoint ...]",
        SECOND_HOST,
    ),
    ("ftvm control /run/vm.sock unprotect", SECOND_HOST),
    ("ftvm control /run/vm.sock timeout 2000", SECOND_HOST),
    ("ftvm ft backup --events /var/log/ftvm-b.jsonl ...", SECOND_HOST),
    ("ftvm ft primary --restore /mnt/shared/vm.snap --backup ...", SECOND_HOST),
    ("ftvm ft primary --mode epoch --epoch-length 65536 --epoch-protocol revised ...", SECOND_HOST),
    ("ftvm ft backup --listen 10.0.0.2:7700 --shared /mnt/shared --disk /srv/b.img --net tap=t0", SECOND_HOST),
    (
        "ftvm ft primary --backup 10.0.0.2:7700 --shared /mnt/shared --mode checkpoint --interval 25 \
         --disk /srv/a.img --net tap=t0,bridge=br0",
        SECOND_HOST,
    ),
    (
        "ftvm ft backup --listen 10.0.0.2:7700 --etcd https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379 \
         --etcd-credentials /etc/ftvm/credentials --vm-name redis-1 --pair-key /etc/ftvm/pair.key --disk /srv/b.img ...",
        SECOND_HOST,
    ),
    (
        "export FTVM_ETCD=https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379 \
         FTVM_CREDENTIALS=/etc/ftvm/alice",
        CLUSTER,
    ),
    (
        "ftvm agent --host-id a --address 10.0.0.1 --state-dir /var/lib/ftvm --credentials /etc/ftvm/credentials",
        CLUSTER,
    ),
    ("ftvm cluster host list", CLUSTER),
    (
        "ftvm cluster vm create redis-1 --memory 512 --bridge br0 --ip 10.0.0.100/24 --protect checkpoint \
         --command 'redis-server /etc/redis/redis.conf --protected-mode no'",
        CLUSTER,
    ),
    (
        "ftvm cluster vm create db --image web --disk-size 8G --memory 1024 --bridge br0 --ip 10.0.0.101/24 \
         --protect checkpoint --user alice:alice.pub:sudo",
        CLUSTER,
    ),
    ("ftvm cluster vm list", CLUSTER),
    ("ftvm cluster vm show redis-1", CLUSTER),
    ("ftvm cluster vm move redis-1 --to b", CLUSTER),
    ("ftvm cluster vm handover redis-1", CLUSTER),
    ("ftvm cluster vm create shell --memory 512 --protect checkpoint", CLUSTER),
    ("ftvm cluster vm console shell", CLUSTER),
    ("ftvm cluster host drain a", CLUSTER),
    ("ftvm cluster host undrain a", CLUSTER),
    ("ftvm cluster events --follow", CLUSTER),
    (
        "curl --cacert /etc/ftvm/alice/ca.pem -H \"Authorization: Bearer $(cat /etc/ftvm/alice/token)\" \
         https://10.0.0.1:7800/metrics",
        CLUSTER,
    ),
];

/// The command lines of the ```sh block under "## Using it": continuation
/// lines joined, comments dropped, blanks collapsed to one space.
fn readme_examples() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let text = std::fs::read_to_string(path).expect("reading README.md");
    let section = text.split("\n## Using it\n").nth(1).expect("README.md has a section \"## Using it\"");
    let block = section.split("```sh\n").nth(1).expect("\"Using it\" has a ```sh block");
    let block = block.split("\n```").next().unwrap();
    let mut lines = Vec::new();
    let mut pending = String::new();
    for raw in block.lines() {
        let code = strip_comment(raw);
        let (code, continued) = match code.trim_end().strip_suffix('\\') {
            Some(c) => (c.to_string(), true),
            None => (code, false),
        };
        pending.push(' ');
        pending.push_str(&code);
        if !continued {
            let line = normalize(&pending);
            if !line.is_empty() {
                lines.push(line);
            }
            pending.clear();
        }
    }
    lines
}

/// `line` without a shell comment (a `#` at a word's start, outside quotes).
fn strip_comment(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].to_string(),
            _ => {}
        }
        prev = c;
    }
    line.to_string()
}

fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every README line is classified once, and every classified line is in
/// the README. Checked before anything runs.
fn check_classification(examples: &[String]) {
    let mut classified: Vec<String> = AS_WRITTEN.iter().map(|l| normalize(l)).collect();
    classified.extend(INSTEAD.iter().map(|(l, _, _)| normalize(l)));
    classified.extend(NOT_RUN.iter().map(|(l, _)| normalize(l)));
    let unclassified: Vec<&String> = examples.iter().filter(|e| !classified.contains(e)).collect();
    assert!(
        unclassified.is_empty(),
        "README.md's \"Using it\" has examples this test does not know: add each to AS_WRITTEN (and a check), \
         INSTEAD or NOT_RUN in crates/ftvm/tests/readme.rs:\n{unclassified:#?}"
    );
    let gone: Vec<&String> = classified.iter().filter(|c| !examples.contains(c)).collect();
    assert!(gone.is_empty(), "classified in readme.rs but no longer in README.md:\n{gone:#?}");
    for c in &classified {
        assert_eq!(classified.iter().filter(|d| *d == c).count(), 1, "classified twice: {c}");
    }
}

/// The examples fall in three groups that share nothing (each its own
/// scratch directory and image cache), run as three tests so that cargo's
/// two test threads run two at once: one after another they took 542 s,
/// which CI cannot afford. Within a group the README's order holds, since
/// an example may use what an earlier one left (an image built, a
/// snapshot taken, a log recorded).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Group {
    /// The image cache: builds, lists, removes, and the runs whose point
    /// is what they do to the image (`--persist`, a run on a copy).
    Images,
    /// A VM's state kept and taken up again: its control socket,
    /// snapshots, record and replay.
    State,
    /// Everything else: runs of the default image and commands that need none.
    Runs,
}

fn group_of(line: &str) -> Group {
    let images = line.starts_with("ftvm image ")
        || ["ftvm run", "ftvm run --persist"].contains(&line)
        || line.starts_with("ftvm run --image ");
    let state = line.contains("/tmp/vm.")
        || line.contains("/run/vm.sock")
        || line.starts_with("ftvm record ")
        || line.starts_with("ftvm replay ");
    match (images, state) {
        (true, _) => Group::Images,
        (false, true) => Group::State,
        _ => Group::Runs,
    }
}

#[test]
fn the_readmes_examples_are_all_classified() {
    let examples = readme_examples();
    assert!(examples.len() > 40, "read {} examples from README.md: the parser lost some", examples.len());
    check_classification(&examples);
}

#[test]
fn the_readmes_image_examples_work_as_written() {
    run_group(Group::Images);
}

#[test]
fn the_readmes_state_examples_work_as_written() {
    run_group(Group::State);
}

#[test]
fn the_readmes_other_examples_work_as_written() {
    run_group(Group::Runs);
}

/// The README's examples of `group` run, and what a user sees, seen.
fn run_group(group: Group) {
    let examples = readme_examples();
    check_classification(&examples);
    let mut cx = Cx::new(group);
    let t0 = Instant::now();
    let (mut ran, mut not_run) = (0, 0);
    for line in examples.iter().filter(|l| group_of(l) == group) {
        if let Some((_, why)) = NOT_RUN.iter().find(|(l, _)| normalize(l) == *line) {
            eprintln!("readme: not run ({why}): {line}");
            not_run += 1;
            continue;
        }
        let run = INSTEAD.iter().find(|(l, _, _)| normalize(l) == *line).map_or(line.as_str(), |(_, i, why)| {
            eprintln!("readme: instead of `{line}` ({why}):");
            i
        });
        let t = Instant::now();
        eprintln!("readme: $ {run}");
        cx.example(line, run);
        eprintln!("readme: ok ({:.1} s)", t.elapsed().as_secs_f64());
        ran += 1;
    }
    cx.finish();
    assert!(ran > 0, "no example of {group:?} ran");
    eprintln!("readme: {group:?}: {ran} examples run in {:.0} s, {not_run} not run", t0.elapsed().as_secs_f64());
}

/// Where the examples run, and what they left for the next ones.
struct Cx {
    scratch: Scratch,
    /// The examples' working directory.
    work: PathBuf,
    bin_dir: PathBuf,
    /// The VM of the snapshot example, between its start and its `quit`.
    snap_vm: Option<Console>,
    /// A VM alone for the control examples the README shows on a pair.
    control_vm: Option<Console>,
}

impl Cx {
    fn new(group: Group) -> Cx {
        let real = ftvm_image::locate()
            .unwrap_or_else(|e| panic!("the default guest image is not available ({e}): run `make image`"));
        let scratch = Scratch::new("readme", &format!("{group:?}").to_lowercase());
        let root = scratch.dir.clone();
        for d in ["work/app", "tmp", "etc/bash_completion.d", "etc/ftvm", "run", "man1", "run-dir"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // The scratch cache: the default image (its root disk a copy, the
        // rest linked: nothing writes them), the real cache's packages.
        let from = real.rootfs.parent().unwrap();
        let to = root.join("cache/images").join(from.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let p = entry.unwrap().path();
            let dst = to.join(p.file_name().unwrap());
            if p == real.rootfs {
                ftvm_image::sparse_copy(&p, &dst).expect("copying the root disk");
            } else if std::fs::hard_link(&p, &dst).is_err() {
                std::fs::copy(&p, &dst).unwrap();
            }
        }
        let debs = ftvm_image::cache_dir().join("debs");
        std::fs::create_dir_all(&debs).unwrap();
        std::os::unix::fs::symlink(&debs, root.join("cache/debs")).unwrap();
        std::fs::write(
            root.join("work/app/main.py"),
            "import sqlite3, sys\nc = sqlite3.connect(':memory:')\n\
             print('python', sys.version_info[0], 'sqlite', c.execute('select 6 * 7').fetchone()[0])\n",
        )
        .unwrap();
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_ftvm")).parent().unwrap().to_path_buf();
        Cx { work: root.join("work"), scratch, bin_dir, snap_vm: None, control_vm: None }
    }

    /// The README's paths under the system's directories, moved into the
    /// scratch directory.
    fn moved(&self, line: &str) -> String {
        let root = common::path_str(&self.scratch.dir);
        line.replace("/usr/local/share/man/man1", &format!("{root}/man1"))
            .replace("/tmp/", &format!("{root}/tmp/"))
            .replace("/etc/", &format!("{root}/etc/"))
            .replace("/run/", &format!("{root}/run/"))
    }

    fn path(&self, p: &str) -> PathBuf {
        PathBuf::from(self.moved(p))
    }

    fn env(&self, c: &mut Command) {
        let path = format!("{}:{}", self.bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        c.current_dir(&self.work)
            .env("PATH", path)
            .env("FTVM_CACHE_DIR", self.scratch.path("cache"))
            .env("FTVM_RUN_DIR", self.scratch.path("run-dir"))
            .env_remove("RUST_LOG");
    }

    /// `line` through `sh -c`, its stdin closed.
    fn sh(&self, line: &str) -> common::Run {
        let mut c = Command::new("sh");
        c.arg("-c").arg(self.moved(line));
        self.env(&mut c);
        common::run_with_timeout(c, LIMIT)
    }

    /// `line` through `sh -c`, which must exit 0: its stdout.
    fn ok(&self, line: &str) -> String {
        let r = self.sh(line);
        assert_eq!(r.status.and_then(|s| s.code()), Some(0), "`{line}`\nstdout: {}\nstderr: {}", r.stdout, r.stderr);
        r.stdout
    }

    /// An interactive `ftvm ...` (a simple command: words and single
    /// quotes), its stdin a pipe the test types into.
    fn console(&self, line: &str) -> Console {
        let words = shell_words(&self.moved(line));
        assert_eq!(words[0], "ftvm", "{line}");
        let mut c = Command::new(env!("CARGO_BIN_EXE_ftvm"));
        c.args(&words[1..]);
        self.env(&mut c);
        Console::start(c)
    }

    fn example(&mut self, line: &str, run: &str) {
        match line {
            "ftvm image build" => {
                let out = self.ok(run);
                assert!(out.trim().ends_with("/images/trixie-riscv64"), "prints the image's directory: {out:?}");
            }
            "ftvm image path" => {
                let out = self.ok(run);
                assert!(Path::new(out.trim()).join("rootfs.ext4").is_file(), "{out:?}");
                assert!(out.trim().starts_with(&common::path_str(&self.scratch.dir)), "the scratch cache: {out:?}");
            }
            "ftvm run" => {
                let mut vm = self.console(run);
                vm.wait_for(PROMPT);
                vm.type_line("uname -m; touch /root/readme-on-a-copy");
                vm.wait_for("riscv64");
                vm.wait_for_count(PROMPT, 2);
                vm.type_bytes(b"\x01x"); // Ctrl-A x
                assert_eq!(vm.wait_end().code(), Some(0), "Ctrl-A x quits\n{}", vm.text());
            }
            "ftvm run --persist" => {
                let mut vm = self.console(run);
                vm.wait_for(PROMPT);
                vm.type_line("echo kept > /root/readme-persisted; poweroff");
                assert_eq!(vm.wait_end().code(), Some(0), "`poweroff` powers off with 0\n{}", vm.text());
                // What the image holds now: the file written with --persist,
                // not the one written on a copy.
                let out = self.ok("ftvm run --exec 'cat /root/readme-persisted; ls /root'");
                assert!(out.starts_with("kept\n"), "{out:?}");
                assert!(!out.contains("readme-on-a-copy"), "a plain run wrote the image: {out:?}");
            }
            "ftvm image build --name py --packages python3,sqlite3 --size 4G --add ./app:/opt/app" => {
                let out = self.ok(run);
                assert!(out.trim().ends_with("/images/py"), "{out:?}");
            }
            "ftvm run --image py --exec 'python3 /opt/app/main.py'" => {
                assert_eq!(self.ok(run), "python 3 sqlite 42\n");
            }
            "ftvm image list" => {
                let out = self.ok(run);
                let names: Vec<&str> = out.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
                assert_eq!(names, ["py", "trixie-riscv64"], "{out}");
                assert!(out.contains("python3,sqlite3"), "its packages: {out}");
            }
            "ftvm image path py" => {
                let out = self.ok(run);
                assert!(out.trim().ends_with("/images/py") && Path::new(out.trim()).is_dir(), "{out:?}");
            }
            "ftvm image rm py" => {
                self.ok(run);
                let gone = self.sh("ftvm image path py");
                assert_ne!(gone.status.and_then(|s| s.code()), Some(0), "{}", gone.stdout);
            }
            "ftvm run --exec 'uname -m'" => assert_eq!(self.ok(run), "riscv64\n"),
            "echo data | ftvm run --exec 'wc -c'" => assert_eq!(self.ok(run).trim(), "5"),
            "ftvm run --exec 'make check' --exec-timeout 3600" => {
                let r = self.sh(run);
                assert_eq!(r.status.and_then(|s| s.code()), Some(124), "{}", r.stderr);
                assert!(r.stderr.contains("did not finish within 5 s (--exec-timeout)"), "{}", r.stderr);
            }
            "ftvm run --stop-timeout 60" => {
                let mut vm = self.console(run);
                vm.wait_for(PROMPT);
                vm.signal(libc::SIGTERM);
                let status = vm.wait_end();
                assert_eq!(status.code(), Some(0), "SIGTERM: the guest powers off, exit 0\n{}", vm.text());
                assert!(vm.text().contains("reboot: Power down"), "{}", vm.text());
            }
            "ftvm --version" => {
                let out = self.ok(run);
                assert!(out.starts_with(&format!("ftvm {}", env!("CARGO_PKG_VERSION"))), "{out:?}");
            }
            "ftvm list" => {
                self.ok(run);
            }
            "ftvm --log-level debug run ..." => {
                let r = self.sh(run);
                assert_eq!(r.status.and_then(|s| s.code()), Some(0), "{}", r.stderr);
                assert!(r.stderr.contains("DEBUG"), "diagnostics on stderr:\n{}", r.stderr);
            }
            "ftvm completions bash > /etc/bash_completion.d/ftvm" => {
                self.ok(run);
                let file = self.path("/etc/bash_completion.d/ftvm");
                let text = std::fs::read_to_string(&file).unwrap();
                assert!(text.contains("complete -F") && text.contains("ftvm"), "{text:.200}");
                let parsed = Command::new("bash").arg("-n").arg(&file).status().unwrap();
                assert!(parsed.success(), "bash -n {}", file.display());
            }
            "ftvm man > ftvm.1; ftvm man --dir /usr/local/share/man/man1" => {
                self.ok(run);
                let page = std::fs::read_to_string(self.work.join("ftvm.1")).unwrap();
                assert!(page.contains(".TH ftvm"), "{page:.200}");
                let run_page = self.path("/usr/local/share/man/man1/ftvm-run.1");
                assert!(std::fs::read_to_string(&run_page).unwrap().contains("\\-\\-exec"), "{}", run_page.display());
            }
            "ftvm run --cpus 2 --mem 2G --disk root.ext4 --disk data.img --disk ro.img,readonly" => {
                // The root disk a copy of the image's (the README used to
                // give data.img first, which the guest then took for its
                // root and could not boot from).
                let image = self.ok("ftvm image path");
                let rootfs = Path::new(image.trim()).join("rootfs.ext4");
                ftvm_image::sparse_copy(&rootfs, &self.work.join("root.ext4")).unwrap();
                for d in ["data.img", "ro.img"] {
                    std::fs::File::create(self.work.join(d)).unwrap().set_len(64 << 20).unwrap();
                }
                let mut vm = self.console(run);
                vm.wait_for(PROMPT);
                vm.type_line("echo cpus=$(nproc) mem=$(awk '/MemTotal/ {print int($2 / 1048576 + 0.5)}' /proc/meminfo)G; for d in /sys/block/vd*; do echo ${d##*/}=$(cat $d/size),ro$(cat $d/ro); done; poweroff");
                assert_eq!(vm.wait_end().code(), Some(0), "{}", vm.text());
                let text = vm.text();
                assert!(text.contains("cpus=2 mem=2G"), "{text}");
                // The image's root disk, then the two disks given, 64 MiB
                // (131072 sectors) each, the second read-only.
                assert!(text.contains("vdb=131072,ro0") && text.contains("vdc=131072,ro1"), "{text}");
            }
            "ftvm run --bios none --kernel prog.elf" => {
                std::fs::write(self.work.join("prog.elf"), bare_metal_hello()).unwrap();
                let out = self.ok(run);
                assert!(out.contains("hi\n"), "the program's output on the console: {out:?}");
            }
            "ftvm run --control /tmp/vm.sock ..." => {
                let vm = self.console(run);
                vm.wait_for(PROMPT);
                self.snap_vm = Some(vm);
                // It is on this host's list, with its socket.
                let out = self.ok("ftvm list");
                assert!(out.contains(&common::path_str(&self.path("/tmp/vm.sock"))), "{out}");
            }
            "ftvm control /tmp/vm.sock pause" => assert_eq!(self.ok(run).trim(), "ok paused"),
            "ftvm control /tmp/vm.sock snapshot /tmp/vm.snap" => {
                assert!(self.ok(run).starts_with("ok snapshot"));
                assert!(self.path("/tmp/vm.snap").is_file());
            }
            "ftvm control /tmp/vm.sock quit" => {
                self.ok(run);
                let mut vm = self.snap_vm.take().expect("the VM of `ftvm run --control /tmp/vm.sock`");
                vm.wait_end();
            }
            "ftvm run --restore /tmp/vm.snap" => {
                let mut vm = self.console(run);
                // The shell waits at its prompt, as when the snapshot was taken.
                vm.type_line("echo restored-$((6 * 7)); poweroff");
                vm.wait_for("restored-42");
                assert_eq!(vm.wait_end().code(), Some(0), "{}", vm.text());
            }
            "ftvm record --log /tmp/vm.log --exec 'head -c 16 /dev/urandom | od -x'" => {
                let out = self.ok(run);
                assert!(out.starts_with("0000000 ") && out.ends_with("0000020\n"), "od's output: {out:?}");
                std::fs::write(self.scratch.path("recorded.txt"), out).unwrap();
            }
            "ftvm replay --log /tmp/vm.log --show-console" => {
                let r = self.sh(run);
                assert_eq!(r.status.and_then(|s| s.code()), Some(0), "{}", r.stderr);
                let recorded = std::fs::read_to_string(self.scratch.path("recorded.txt")).unwrap();
                let first = recorded.lines().next().unwrap();
                assert!(
                    r.stdout.contains(first),
                    "the replay shows the recorded random bytes {first:?}:\n{}",
                    r.stdout
                );
                assert!(r.stderr.contains("state checks matched"), "{}", r.stderr);
            }
            "ftvm replay --log /tmp/vm.log --then-run" => {
                let mut rec = self.console("ftvm record --log /tmp/live.log");
                rec.wait_for(PROMPT);
                rec.signal(libc::SIGINT);
                assert_eq!(rec.wait_end().code(), Some(0), "a recording ends as quit on SIGINT\n{}", rec.text());
                let mut vm = self.console(run);
                // Replayed to where the shell waits at its prompt, then live:
                // the shell answers what is typed (held until then).
                vm.type_line("echo live-$((6 * 7)); poweroff");
                vm.wait_for("live-42");
                assert_eq!(vm.wait_end().code(), Some(0), "{}", vm.text());
            }
            "ftvm ft keygen /etc/ftvm/pair.key" => {
                self.ok(run);
                let meta = std::fs::metadata(self.path("/etc/ftvm/pair.key")).unwrap();
                assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            }
            "ftvm control /run/vm.sock status" => {
                let vm = self.console("ftvm run --control /run/vm.sock");
                vm.wait_for(PROMPT);
                self.control_vm = Some(vm);
                assert!(self.ok(run).starts_with("ok "), "status");
            }
            "ftvm control --json /run/vm.sock status" => {
                let out = self.ok(run);
                let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
                assert!(v["ok"]["state"].is_string() || v["ok"]["state"].is_object(), "{out}");
            }
            "ftvm control /run/vm.sock snapshot vm.snap" => {
                assert!(self.ok(run).starts_with("ok snapshot"));
                assert!(self.work.join("vm.snap").is_file(), "relative to the client's directory");
            }
            "ftvm cluster init /etc/ftvm/authority" => {
                self.ok(run);
                for secret in ["/etc/ftvm/authority/ca.key", "/etc/ftvm/authority/token"] {
                    let meta = std::fs::metadata(self.path(secret)).unwrap();
                    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{secret}");
                }
            }
            "ftvm cluster issue /etc/ftvm/authority /etc/ftvm/host-a --name a --ip 10.0.0.1"
            | "ftvm cluster issue /etc/ftvm/authority /etc/ftvm/alice --name alice" => {
                self.ok(run);
                let dir = if line.contains("host-a") { "/etc/ftvm/host-a" } else { "/etc/ftvm/alice" };
                let meta = std::fs::metadata(self.path(&format!("{dir}/key.pem"))).unwrap();
                assert_eq!(meta.permissions().mode() & 0o777, 0o600);
                // The certificate is the authority's, as any TLS stack
                // checks it (openssl here), and names the host's address.
                let verify = self.ok(&format!("openssl verify -CAfile {dir}/ca.pem {dir}/cert.pem"));
                assert!(verify.trim_end().ends_with(": OK"), "{verify}");
                if line.contains("host-a") {
                    let text = self.ok(&format!("openssl x509 -noout -text -in {dir}/cert.pem"));
                    assert!(text.contains("IP Address:10.0.0.1"), "{text}");
                }
            }
            other => panic!("classified as run but no check written: {other}"),
        }
    }

    fn finish(&mut self) {
        if let Some(mut vm) = self.control_vm.take() {
            self.ok("ftvm control /run/vm.sock quit");
            vm.wait_end();
        }
    }
}

/// Words of a simple command line: blanks split, single quotes group.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => (word, any) = (word + &c.to_string(), true),
        }
    }
    if any {
        words.push(word);
    }
    words
}

/// A bare-metal RV64 program in M-mode for the README's `prog.elf`: "hi"
/// on the UART (0x1000_0000), then power off through the SiFive test
/// device (0x10_0000, 0x5555: pass). Hand-assembled, as the tests need no
/// cross compiler.
fn bare_metal_hello() -> Vec<u8> {
    let code: [u32; 11] = [
        0x1000_02b7, // lui  t0, 0x10000       t0 = UART
        0x0680_0313, // li   t1, 'h'
        0x0062_8023, // sb   t1, 0(t0)
        0x0690_0313, // li   t1, 'i'
        0x0062_8023, // sb   t1, 0(t0)
        0x00a0_0313, // li   t1, '\n'
        0x0062_8023, // sb   t1, 0(t0)
        0x0010_02b7, // lui  t0, 0x100         t0 = test device
        0x0000_5337, // lui  t1, 0x5
        0x5553_0313, // addi t1, t1, 0x555     t1 = 0x5555
        0x0062_a023, // sw   t1, 0(t0)
    ];
    let mut data: Vec<u8> = code.iter().flat_map(|i| i.to_le_bytes()).collect();
    data.extend_from_slice(&0x0000_006fu32.to_le_bytes()); // j .
    common::riscv_elf(data.len() as u64, &data)
}

/// An interactive VM: what it prints (stdout and stderr) collected as it
/// comes, its stdin typed into.
struct Console {
    child: Child,
    seen: Arc<Mutex<String>>,
}

impl Console {
    fn start(mut c: Command) -> Console {
        let mut child =
            c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting ftvm");
        let seen = Arc::new(Mutex::new(String::new()));
        for pipe in
            [Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, Box::new(child.stderr.take().unwrap())]
        {
            let sink = seen.clone();
            let mut pipe = pipe;
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        Console { child, seen }
    }

    fn text(&self) -> String {
        self.seen.lock().unwrap().clone()
    }

    fn wait_for(&self, needle: &str) {
        self.wait_for_count(needle, 1);
    }

    fn wait_for_count(&self, needle: &str, n: usize) {
        let t0 = Instant::now();
        while self.text().matches(needle).count() < n {
            assert!(t0.elapsed() < LIMIT, "no {needle:?} (x{n}) within {LIMIT:?}; got:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn type_bytes(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn type_line(&mut self, line: &str) {
        self.type_bytes(format!("{line}\n").as_bytes());
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    fn wait_end(&mut self) -> ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The output threads finish with the pipes.
                std::thread::sleep(Duration::from_millis(200));
                return status;
            }
            assert!(t0.elapsed() < LIMIT, "the VM had not ended after {LIMIT:?}:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
