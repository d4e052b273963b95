//! Bare-metal ISA tests: every `tests/isa/*.S` is assembled with the
//! RISC-V cross compiler and run on the `ftvm` binary with no firmware.
//!
//! A test program reports through the SiFive test device: exit status 0 is
//! a pass, exit status `n` means check number `n` failed (255: a failure
//! outside any numbered check). The program's UART output is shown on
//! failure; it names the check and the values found and expected.
//!
//! Each program runs three ways: interpreted (`FTVM_JIT=0`), with the
//! translation tier as it comes (hot blocks translated), and with every
//! block translated at its first entry (`FTVM_JIT=hot=1`), so that a
//! translation differing from the interpreter fails a check.
//!
//! Header lines at the top of a source select the number of harts
//! (`# cpus: 2`) and the extensions it is assembled for (`# march:
//! rv64gc_zba_zbb_zbs`, rv64gc without it). The same programs run unchanged on QEMU (`tests/isa/run-on-qemu.sh`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const CROSS_CC: &str = "riscv64-linux-gnu-gcc";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The translation modes each program runs in: `FTVM_JIT`'s value, None
/// for the default.
const MODES: [Option<&str>; 3] = [Some("0"), None, Some("hot=1")];

macro_rules! isa_tests {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_isa_test($file);
            }
        )*

        /// Every source the macro generated a test for.
        const LISTED: &[&str] = &[$($file),*];
    };
}

isa_tests! {
    rv64i => "rv64i.S",
    rv64m => "rv64m.S",
    rv64a => "rv64a.S",
    rv64c => "rv64c.S",
    rv64f => "rv64f.S",
    rv64d => "rv64d.S",
    zicsr => "zicsr.S",
    counters => "counters.S",
    privileged => "privileged.S",
    interrupts => "interrupts.S",
    paging => "paging.S",
    pmp => "pmp.S",
    smp => "smp.S",
    smc => "smc.S",
    zb => "zb.S",
    zicond => "zicond.S",
    sstc => "sstc.S",
    zicbo => "zicbo.S",
}

#[test]
fn every_isa_source_is_listed() {
    let dir = isa_dir();
    let mut missing = Vec::new();
    let mut found = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("S") {
            continue;
        }
        found += 1;
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !LISTED.contains(&name.as_str()) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/isa sources without a test in crates/ftvm/tests/isa.rs (add them to isa_tests!): {missing:?}"
    );
    for listed in LISTED {
        assert!(dir.join(listed).is_file(), "{listed} is listed but tests/isa/{listed} does not exist");
    }
    assert_eq!(found, LISTED.len());
}

fn workspace_root() -> PathBuf {
    // crates/ftvm -> workspace root
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn isa_dir() -> PathBuf {
    workspace_root().join("tests/isa")
}

/// The value of `# key: value` in the leading comment lines of the source.
fn header_of<'a>(source: &'a str, key: &str) -> Option<&'a str> {
    source.lines().take(20).map(str::trim).filter(|l| l.starts_with('#')).find_map(|line| {
        line.trim_start_matches('#').trim().strip_prefix(key).and_then(|r| r.strip_prefix(':')).map(str::trim)
    })
}

/// `# cpus: N`, 1 without it.
fn cpus_of(source: &str) -> u32 {
    header_of(source, "cpus").map_or(1, |v| v.parse().unwrap_or_else(|_| panic!("bad `# cpus:` line: {v}")))
}

fn assemble(source: &Path, march: &str, elf: &Path) {
    let root = workspace_root();
    let output = Command::new(CROSS_CC)
        .current_dir(&root)
        .arg(format!("-march={march}"))
        .args(["-mabi=lp64d", "-nostdlib", "-nostartfiles", "-static", "-T"])
        .arg(root.join("tests/isa/link.ld"))
        .arg("-o")
        .arg(elf)
        .arg(source)
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "the RISC-V cross compiler `{CROSS_CC}` is not installed: run `scripts/install-deps.sh` \
             (it installs Debian's gcc-riscv64-linux-gnu)"
        ),
        Err(e) => panic!("could not run {CROSS_CC}: {e}"),
    };
    assert!(
        output.status.success(),
        "assembling {} failed ({}):\n{}{}",
        source.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Reads a child's pipe to the end on a thread, so a chatty program can
/// never block on a full pipe while we wait for it.
fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Waits for the child up to `timeout`; kills it and returns `None` after.
fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait().expect("waiting for ftvm") {
            Some(status) => return Some(status),
            None if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            None => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The source line that starts check `n`: `TEST_BEGIN(n)` or `TEST_xx(n, ...)`.
fn check_line(source: &str, n: i32) -> Option<(usize, String)> {
    let (call, args) = (format!("({n})"), format!("({n},"));
    source
        .lines()
        .enumerate()
        .find(|(_, line)| line.contains("TEST") && (line.contains(&call) || line.contains(&args)))
        .map(|(i, line)| (i + 1, line.trim().to_string()))
}

fn run_isa_test(file: &str) {
    let source_path = isa_dir().join(file);
    let source =
        std::fs::read_to_string(&source_path).unwrap_or_else(|e| panic!("reading {}: {e}", source_path.display()));
    let cpus = cpus_of(&source);

    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("isa");
    std::fs::create_dir_all(&out_dir).expect("creating the output directory");
    let elf = out_dir.join(file).with_extension("elf");
    assemble(&source_path, header_of(&source, "march").unwrap_or("rv64gc"), &elf);
    for mode in MODES {
        run_elf(file, &source, cpus, &elf, mode);
    }
}

/// Runs `elf`, assembled from `file`, with `FTVM_JIT` set to `mode` (None:
/// unset), and fails the test with its output unless it exits 0.
fn run_elf(file: &str, source: &str, cpus: u32, elf: &Path, mode: Option<&str>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ftvm"));
    command.args(["run", "--bios", "none", "--kernel"]).arg(elf).args(["--mem", "128M"]);
    if cpus > 1 {
        command.args(["--cpus", &cpus.to_string()]);
    }
    match mode {
        Some(m) => command.env("FTVM_JIT", m),
        None => command.env_remove("FTVM_JIT"),
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", env!("CARGO_BIN_EXE_ftvm")));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let status = wait_with_timeout(&mut child, TIMEOUT);
    let stdout = String::from_utf8_lossy(&stdout.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
    let report = |what: String| -> ! {
        panic!(
            "tests/isa/{file} (cpus: {cpus}, FTVM_JIT {}): {what}\n\
             --- program output (UART) ---\n{stdout}\n--- ftvm stderr ---\n{stderr}\n\
             --- reproduce: {}ftvm run --bios none --kernel {} --mem 128M{} ---",
            mode.unwrap_or("unset"),
            mode.map(|m| format!("FTVM_JIT={m} ")).unwrap_or_default(),
            elf.display(),
            if cpus > 1 { format!(" --cpus {cpus}") } else { String::new() }
        )
    };
    match status {
        None => report(format!("timed out after {} s (killed)", TIMEOUT.as_secs())),
        Some(status) => match status.code() {
            Some(0) => {}
            Some(255) => report("failed outside any numbered check (exit status 255)".into()),
            Some(n) => report(format!(
                "check {n} failed (exit status {n}){}",
                check_line(source, n).map(|(no, line)| format!("\n  line {no}: {line}")).unwrap_or_default()
            )),
            None => report(format!("ftvm did not exit normally: {status}")),
        },
    }
}
