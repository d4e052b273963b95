//! The image build pipeline (host side). Needs root (mmdebstrap extracts
//! packages with their real ownership, which `mke2fs -d` copies).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::artifacts::{self, KernelFormat};
use crate::cpio::CpioWriter;
use crate::modules::ModuleDb;
use crate::{BuildOptions, GuestImage, ImageError, ImageSpec, Progress, Reporter, Stamp};

/// Host tools and the Debian package providing each.
const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    ("mke2fs", "e2fsprogs"),
    ("depmod", "kmod"),
    ("xz", "xz-utils"),
    ("zstd", "zstd"),
    ("gzip", "gzip"),
    ("e2image", "e2fsprogs"),
    ("e2fsck", "e2fsprogs"),
    ("resize2fs", "e2fsprogs"),
    ("dpkg-deb", "dpkg"),
];

/// The build's steps, as [`Progress::Step`] numbers them.
const STEPS: [&str; 8] = [
    "fetching Debian packages",
    "preparing the kernel and firmware",
    "resolving kernel modules",
    "building the initramfs",
    "preparing the root filesystem",
    "creating rootfs.ext4",
    "configuring the packages (dpkg and apt in the guest, on ftvm)",
    "compacting rootfs.ext4",
];

struct Ctx {
    start: Instant,
    progress: Option<Reporter>,
}

impl Ctx {
    fn say(&self, msg: &str) {
        if let Some(r) = &self.progress {
            r(Progress::Note(msg));
        }
    }

    /// Step `number` (from 1) of [`STEPS`] begins.
    fn step(&self, number: usize) {
        if let Some(r) = &self.progress {
            r(Progress::Step { number, of: STEPS.len(), what: STEPS[number - 1] });
        }
    }
}

fn err(step: &str, cause: impl std::fmt::Display) -> ImageError {
    ImageError::new(step, cause.to_string())
}

/// Find a tool in `$PATH` plus the sbin directories (often missing from a
/// user's PATH).
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].iter().map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// `$PATH` plus the standard directories, for the tools we run (mmdebstrap
/// needs apt-config, dpkg, ... from them).
fn child_path() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for d in ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    std::env::join_paths(dirs).unwrap_or(path)
}

pub(crate) fn tool(name: &str) -> Result<PathBuf, ImageError> {
    let pkg = TOOLS.iter().find(|(t, _)| *t == name).map(|(_, p)| *p).unwrap_or(name);
    which(name).ok_or_else(|| {
        err(
            "checking host tools",
            format!("`{name}` not found; install the Debian package `{pkg}` (or run scripts/install-deps.sh)"),
        )
    })
}

fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Run a command; on failure the error names the step and shows the tail of
/// its output (also saved to `log` when given).
pub(crate) fn run(step: &str, cmd: &mut Command, log: Option<&Path>) -> Result<(), ImageError> {
    run_accepting(step, cmd, log, |status| status.success())
}

/// [`run`], with `accepted` saying which exit statuses are success (e2fsck
/// says it changed something with 1).
pub(crate) fn run_accepting(
    step: &str,
    cmd: &mut Command,
    log: Option<&Path>,
    accepted: impl Fn(std::process::ExitStatus) -> bool,
) -> Result<(), ImageError> {
    let out = cmd
        .env("PATH", child_path())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(step, format!("cannot start {:?}: {e}", cmd.get_program())))?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    if let Some(log) = log {
        let _ =
            fs::OpenOptions::new().create(true).append(true).open(log).and_then(|mut f| f.write_all(text.as_bytes()));
    }
    if accepted(out.status) {
        return Ok(());
    }
    Err(failure(step, cmd, out.status, &text))
}

/// A command's failure: its first apt `E:` line, else its last lines.
fn failure(step: &str, cmd: &Command, status: std::process::ExitStatus, text: &str) -> ImageError {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    // apt/mmdebstrap: the first "E:" line is the actual cause
    let tail = match lines.iter().find(|l| l.starts_with("E: ")) {
        Some(e) => e.to_string(),
        None => lines[lines.len().saturating_sub(3)..].join(" | "),
    };
    err(
        step,
        format!(
            "{} failed ({status}): {}",
            cmd.get_program().to_string_lossy(),
            if tail.is_empty() { "no output" } else { &tail }
        ),
    )
}

/// [`run`], telling the reporter the command's own steps as it goes
/// (mmdebstrap's `I:` lines: updating the index, downloading, extracting);
/// everything it prints goes to `log`.
fn run_telling(step: &str, cmd: &mut Command, log: &Path, ctx: &Ctx) -> Result<(), ImageError> {
    use std::io::BufRead;
    let mut child = cmd
        .env("PATH", child_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(step, format!("cannot start {:?}: {e}", cmd.get_program())))?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let readers: Vec<_> = [
        Box::new(child.stdout.take().expect("piped")) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().expect("piped")),
    ]
    .into_iter()
    .map(|pipe| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        })
    })
    .collect();
    drop(tx);
    let mut text = String::new();
    for line in rx {
        // (our own hook's line is the whole shell command: no news)
        if let Some(info) = line.strip_prefix("I: ").filter(|l| !l.starts_with("running --setup-hook")) {
            ctx.say(info);
        }
        text.push_str(&line);
        text.push('\n');
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child.wait().map_err(|e| err(step, e))?;
    let _ = fs::OpenOptions::new().create(true).append(true).open(log).and_then(|mut f| f.write_all(text.as_bytes()));
    if status.success() {
        Ok(())
    } else {
        Err(failure(step, cmd, status, &text))
    }
}

/// Tells the reporter, twice a second while it lives, the bytes in apt's
/// archive directory (the packages fetched so far, and kept ones).
struct ArchiveWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ArchiveWatch {
    fn start(reporter: Option<Reporter>, dir: PathBuf) -> ArchiveWatch {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let thread = reporter.map(|r| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    let bytes = dir_bytes(&dir) + dir_bytes(&dir.join("partial"));
                    if bytes != last {
                        r(Progress::Bytes(bytes));
                        last = bytes;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
            })
        });
        ArchiveWatch { stop, thread }
    }
}

impl Drop for ArchiveWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bytes of the regular files directly in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Bytes a tree takes in ext4, roughly: each file's size rounded up to a
/// 4 KiB block, and a block for every directory and symlink.
fn tree_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            total += m.len().div_ceil(4096).max(1) * 4096;
            if m.is_dir() {
                dirs.push(e.path());
            }
        }
    }
    total
}

/// Where the guest path `dest` is inside `root`, following the root's own
/// symlinks as the guest would (an absolute link is the root's, never the
/// host's: `var/run -> /run` must not lead out of the build).
fn path_in_root(root: &Path, dest: &str) -> std::io::Result<PathBuf> {
    let mut todo: Vec<String> =
        dest.split('/').filter(|c| !c.is_empty() && *c != ".").rev().map(String::from).collect();
    let mut at = PathBuf::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&c);
        match fs::symlink_metadata(root.join(&next)) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(std::io::Error::other(format!("too many symlinks under {dest}")));
                }
                let target = fs::read_link(root.join(&next))?;
                let t = target.to_string_lossy();
                if t.starts_with('/') {
                    at = PathBuf::new();
                }
                todo.extend(t.split('/').filter(|c| !c.is_empty() && *c != ".").rev().map(String::from));
            }
            _ => at = next,
        }
    }
    Ok(root.join(at))
}

/// Put the user's directory (its contents) or tarball (extracted) at
/// `dest` in the root, owned by root (as the packages' files are).
fn add_files(source: &Path, dest: &str, root: &Path, log: &Path) -> Result<(), ImageError> {
    let step = format!("adding {}", source.display());
    let dest = path_in_root(root, dest).map_err(|e| err(&step, e))?;
    fs::create_dir_all(&dest).map_err(|e| err(&step, format!("{}: {e}", dest.display())))?;
    if source.is_dir() {
        let mut from = source.to_path_buf().into_os_string();
        from.push("/.");
        run(&step, Command::new("cp").args(["-a", "--no-preserve=ownership", "--"]).arg(from).arg(&dest), Some(log))
    } else {
        run(
            &step,
            Command::new("tar").args(["-x", "--no-same-owner", "-f"]).arg(source).arg("-C").arg(&dest),
            Some(log),
        )
    }
}

/// Writes `/var/lib/ftvm/essential` in the root: the files of the
/// packages the guest installs first (see [`crate::essential`]).
fn essential_list(archives: &Path, root: &Path) -> Result<(), ImageError> {
    let step = "finding the essential packages";
    let dpkg_deb = tool("dpkg-deb")?;
    let mut debs: Vec<(String, crate::essential::Control)> = Vec::new();
    for e in fs::read_dir(archives).map_err(|e| err(step, e))?.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        if !file.ends_with(".deb") {
            continue;
        }
        let out = Command::new(&dpkg_deb)
            .arg("-f")
            .arg(e.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| err(step, format!("cannot start dpkg-deb: {e}")))?;
        if !out.status.success() {
            return Err(err(step, format!("dpkg-deb -f {file}: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        debs.push((file, crate::essential::Control::parse(&String::from_utf8_lossy(&out.stdout))));
    }
    let set = crate::essential::closure(&debs.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>());
    let mut files: Vec<&str> = debs.iter().filter(|(_, c)| set.contains(&c.name)).map(|(f, _)| f.as_str()).collect();
    files.sort();
    let dir = root.join("var/lib/ftvm");
    fs::create_dir_all(&dir).map_err(|e| err(step, e))?;
    fs::write(dir.join("essential"), files.iter().map(|f| format!("{f}\n")).collect::<String>())
        .map_err(|e| err(step, e))
}

/// Where the user's files wait in the root until the packages are
/// configured (`guest/lib/configure` puts each in its place, as `list`
/// says, and removes the directory).
const ADDS_DIR: &str = "/var/lib/ftvm/adds";

/// Boots the root disk once under the guest's minimal init and runs the
/// configuration script in it (see `guest/lib/configure`), telling its
/// progress; its whole transcript goes to the build's log.
fn configure(
    ctx: &Ctx,
    runner: &dyn crate::GuestRunner,
    out: &Path,
    rootfs: &Path,
    log: &Path,
) -> Result<(), ImageError> {
    let step = "configuring the packages in the guest";
    let (firmware, kernel, initrd) = (out.join("fw_dynamic.bin"), out.join("Image"), out.join("initrd.img"));
    let cmdline = format!("console=ttyS0 ftvm.init={}", crate::MINIMAL_INIT);
    let boot = crate::GuestBoot {
        firmware: &firmware,
        kernel: &kernel,
        initrd: &initrd,
        disk: rootfs,
        cmdline: &cmdline,
        command: crate::CONFIGURE_COMMAND,
    };
    let mut transcript = fs::OpenOptions::new().create(true).append(true).open(log).map_err(|e| err(step, e))?;
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut set_up = 0;
    let status = runner.run(&boot, &mut |line: &str| {
        let _ = writeln!(transcript, "{line}");
        if let Some(note) = line.strip_prefix("ftvm-configure: ") {
            ctx.say(note);
        } else if let Some(pkg) = line.strip_prefix("Setting up ") {
            set_up += 1;
            ctx.say(&format!("set up {set_up}: {}", pkg.trim_end_matches(" ...")));
        }
        if !line.trim().is_empty() {
            if tail.len() == 3 {
                tail.pop_front();
            }
            tail.push_back(line.trim().to_string());
        }
    });
    let status = status.map_err(|e| err(step, e))?;
    if status != 0 {
        let tail: Vec<String> = tail.into_iter().collect();
        return Err(err(step, format!("the guest's configuration ended with status {status}: {}", tail.join(" | "))));
    }
    Ok(())
}

/// Pipe `input` through `prog args...` into `out`.
fn filter(step: &str, prog: &Path, args: &[&str], input: &[u8], out: &Path) -> Result<(), ImageError> {
    let file = fs::File::create(out).map_err(|e| err(step, format!("{}: {e}", out.display())))?;
    let mut child = Command::new(prog)
        .env("PATH", child_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(file)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err(step, format!("cannot start {}: {e}", prog.display())))?;
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).ok();
    let status = child.wait().map_err(|e| err(step, e))?;
    let wrote = writer.join().unwrap_or(Ok(()));
    if !status.success() {
        return Err(err(step, format!("{} failed ({status}): {}", prog.display(), stderr.trim())));
    }
    wrote.map_err(|e| err(step, format!("writing to {}: {e}", prog.display())))
}

/// Decompress a file with `prog -dc`.
fn decompress(step: &str, prog: &Path, file: &Path) -> Result<Vec<u8>, ImageError> {
    let out = Command::new(prog)
        .env("PATH", child_path())
        .arg("-dc")
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| err(step, format!("cannot start {}: {e}", prog.display())))?;
    if !out.status.success() {
        return Err(err(
            step,
            format!(
                "{} -dc {} failed: {}",
                prog.display(),
                file.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(out.stdout)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn pid_alive(pid: &str) -> bool {
    Path::new("/proc").join(pid).exists()
}

pub(crate) fn build(opts: &BuildOptions, final_dir: &Path) -> Result<GuestImage, ImageError> {
    let ctx = Ctx { start: Instant::now(), progress: opts.progress.clone() };
    let spec = &opts.spec;
    match crate::locate_in(final_dir) {
        Ok((img, stamp)) if !opts.force && spec.built_as(&stamp) => {
            ctx.say(&format!("image is up to date in {}", final_dir.display()));
            return Ok(img);
        }
        Ok((_, stamp)) if !spec.built_as(&stamp) => ctx.say(&format!(
            "replacing {}: it was built with other packages ({}), size or files",
            spec.name,
            if stamp.extra_packages.is_empty() { "none extra".into() } else { stamp.extra_packages.join(",") }
        )),
        _ => {}
    }

    // ---- preflight
    let runner = opts.runner.clone().ok_or_else(|| {
        err(
            "checking the build's means",
            "configuring the packages needs a guest to run them in: build images with `ftvm image build`",
        )
    })?;
    for (t, _) in TOOLS {
        tool(t)?;
    }
    if effective_uid() != Some(0) {
        return Err(err(
            "checking privileges",
            "building the image needs root (mmdebstrap extracts packages with their real owners, which mke2fs copies into the root filesystem); run it as root, e.g. `sudo ftvm image build`",
        ));
    }
    let env_mirror = std::env::var("FTVM_DEBIAN_MIRROR").ok();
    let mirror = crate::mirror::resolve(opts.mirror.as_deref(), env_mirror.as_deref(), Path::new("/"))?;

    let images = final_dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    fs::create_dir_all(&images)
        .map_err(|e| err("creating the cache directory", format!("{}: {e}", images.display())))?;
    // leftovers of interrupted builds
    if let Ok(rd) = fs::read_dir(&images) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(".build-").or_else(|| name.strip_prefix(".old-")) {
                if !pid_alive(pid) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let work = images.join(format!(".build-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| err("creating the build directory", format!("{}: {e}", work.display())))?;
    let result = build_in(&ctx, &work, &mirror, spec, &*runner);
    let result = result.and_then(|mut stamp| {
        spec.stamp_fields(&mut stamp);
        install(&ctx, &work, final_dir, stamp)
    });
    let saved_log = images.join("last-build.log");
    let _ = fs::rename(work.join("build.log"), &saved_log);
    let result = result.map_err(|mut e| {
        if saved_log.exists() {
            e.cause.push_str(&format!(" (log: {})", saved_log.display()));
        }
        e
    });
    let _ = fs::remove_dir_all(&work);
    result
}

fn install(ctx: &Ctx, work: &Path, final_dir: &Path, mut stamp: Stamp) -> Result<GuestImage, ImageError> {
    let step = "installing the image";
    let out = work.join("image");
    stamp.build_seconds = ctx.start.elapsed().as_secs_f64();
    ctx.say("installing the image");
    fs::write(out.join(crate::STAMP_FILE), stamp.render()).map_err(|e| err(step, e))?;
    let old = final_dir.with_file_name(format!(".old-{}", std::process::id()));
    if final_dir.exists() {
        fs::rename(final_dir, &old).map_err(|e| err(step, format!("moving the old image aside: {e}")))?;
    }
    fs::rename(&out, final_dir).map_err(|e| err(step, format!("{} -> {}: {e}", out.display(), final_dir.display())))?;
    let _ = fs::remove_dir_all(&old);
    let (img, _) = crate::locate_in(final_dir)?;
    ctx.say(&format!("done: {} (kernel {})", final_dir.display(), img.kernel_version));
    Ok(img)
}

fn build_in(
    ctx: &Ctx,
    work: &Path,
    mirror: &str,
    spec: &ImageSpec,
    runner: &dyn crate::GuestRunner,
) -> Result<Stamp, ImageError> {
    let stage = work.join("stage");
    let out = work.join("image");
    fs::create_dir_all(&out).map_err(|e| err("creating the build directory", e))?;
    let log = work.join("build.log");

    // ---- 1. packages
    ctx.step(1);
    ctx.say(&format!("fetching {} {} packages with mmdebstrap from {mirror}", crate::SUITE, crate::ARCH));
    let step = "extracting Debian packages (mmdebstrap)";
    // .debs of the previous build (of this image, and of the default one a
    // named image shares most packages with): apt skips downloading files
    // it finds in the target's archive directory with the right hash
    let debs = crate::cache_dir().join("debs");
    let deb_cache = debs.join(&spec.name);
    let mut hooks = Vec::new();
    let mut seeds = vec![debs.join(crate::IMAGE_NAME)];
    if spec.name != crate::IMAGE_NAME {
        seeds.push(deb_cache.clone());
    }
    for seed in seeds.iter().filter(|d| fs::read_dir(d).map(|mut d| d.next().is_some()).unwrap_or(false)) {
        let q = shell_quote(&seed.to_string_lossy());
        hooks.push(format!(
            "--setup-hook=mkdir -p \"$1/var/cache/apt/archives\" && for f in {q}/*.deb; do ln -f \"$f\" \"$1/var/cache/apt/archives/\" 2>/dev/null || cp \"$f\" \"$1/var/cache/apt/archives/\"; done; true"
        ));
    }
    let packages: Vec<&str> = crate::PACKAGES.iter().copied().chain(spec.packages.iter().map(String::as_str)).collect();
    let extract = |suite: &str| {
        let _ = fs::remove_dir_all(&stage);
        // The bytes of packages at hand, told while apt fetches them.
        let _watch = ArchiveWatch::start(ctx.progress.clone(), stage.join("var/cache/apt/archives"));
        run_telling(
            step,
            Command::new(tool("mmdebstrap")?)
                .args(&hooks)
                .arg("--mode=root")
                .arg("--variant=extract")
                .arg(format!("--architectures={}", crate::ARCH))
                .arg("--components=main")
                .arg(format!("--include={}", crate::ESSENTIAL))
                .arg(format!("--include={}", packages.join(",")))
                .arg("--aptopt=Acquire::Languages \"none\"")
                .arg("--aptopt=Acquire::Retries \"3\"")
                .arg("--skip=cleanup/apt/cache")
                .arg("--skip=cleanup/apt/lists")
                .arg(suite)
                .arg(&stage)
                .arg(mirror),
            &log,
            ctx,
        )
    };
    if let Err(e) = extract(crate::SUITE) {
        // A mirror caught between syncs serves a signed Release whose
        // index files it does not have yet ("Mirror sync in progress?").
        // Its suite alias (`stable`) is signed separately and often still
        // whole; it is the same release only if its Codename says so,
        // which is checked below from the Release apt verified.
        let log_text = fs::read_to_string(&log).unwrap_or_default();
        if !mirror_mid_sync(&log_text) {
            return Err(e);
        }
        ctx.say(&format!(
            "the mirror's {} index does not match its Release (mirror mid-sync); trying its `{}` alias",
            crate::SUITE,
            crate::SUITE_ALIAS
        ));
        extract(crate::SUITE_ALIAS).map_err(|_| e)?;
        let codename = release_codename(&stage.join("var/lib/apt/lists"));
        if codename.as_deref() != Some(crate::SUITE) {
            return Err(err(
                step,
                format!(
                    "the mirror's {} index is mid-sync and its `{}` alias is {}, not {}",
                    crate::SUITE,
                    crate::SUITE_ALIAS,
                    codename.unwrap_or_else(|| "of no known codename".into()),
                    crate::SUITE
                ),
            ));
        }
    }
    // The .debs stay in the root: the guest installs the packages from
    // them (guest/lib/configure), and removes them. apt's lists go: apt
    // resolves among the .debs it is given, and parsing the archive's
    // index took the guest minutes.
    let _ = fs::remove_dir_all(stage.join("var/lib/apt/lists"));
    let archives = stage.join("var/cache/apt/archives");
    let mut packages: Vec<(String, String)> = fs::read_dir(&archives)
        .map_err(|e| err(step, format!("{}: {e}", archives.display())))?
        .flatten()
        .filter_map(|e| artifacts::deb_name_version(&e.file_name().to_string_lossy()))
        .collect();
    packages.sort();
    if packages.is_empty() {
        return Err(err(step, "no packages were downloaded"));
    }
    let deb_bytes: u64 = fs::read_dir(&archives)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    if let Some(r) = &ctx.progress {
        r(Progress::Bytes(deb_bytes));
    }
    // keep exactly this build's .debs for the next one (links: the build
    // directory and the cache are one filesystem)
    let _ = fs::remove_dir_all(&deb_cache);
    let _ = fs::create_dir_all(&deb_cache);
    for e in fs::read_dir(&archives).into_iter().flatten().flatten() {
        if e.path().extension().is_some_and(|x| x == "deb") {
            let kept = deb_cache.join(e.file_name());
            if fs::hard_link(e.path(), &kept).is_err() {
                let _ = fs::copy(e.path(), &kept);
            }
        }
    }
    ctx.say(&format!("extracted {} packages ({} MiB)", packages.len(), deb_bytes >> 20));
    essential_list(&archives, &stage)?;

    // merged /usr (trixie packages ship under /usr only)
    for (link, target) in [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib")] {
        let p = stage.join(link);
        if fs::symlink_metadata(&p).is_err() && stage.join(target).is_dir() {
            symlink(target, &p).map_err(|e| err("merging /usr", e))?;
        }
    }

    // ---- 2. kernel
    ctx.step(2);
    let step = "finding the kernel";
    let boot = stage.join("boot");
    let mut kernels: Vec<PathBuf> = fs::read_dir(&boot)
        .map_err(|e| err(step, format!("{}: {e}", boot.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("vmlinux-") || n.starts_with("vmlinuz-")
        })
        .collect();
    kernels.sort();
    let kfile = kernels.pop().ok_or_else(|| err(step, format!("no vmlinux-*/vmlinuz-* in {}", boot.display())))?;
    let kname = kfile.file_name().unwrap().to_string_lossy().into_owned();
    let version = kname[8..].to_string();
    let kernel_pkg = packages.iter().find(|(p, _)| *p == format!("linux-image-{version}"));
    ctx.say(&format!(
        "kernel {version} from {}",
        kernel_pkg.map(|(p, v)| format!("{p} {v}")).unwrap_or_else(|| "an unknown package".into())
    ));
    let data = fs::read(&kfile).map_err(|e| err(step, format!("{}: {e}", kfile.display())))?;
    let step = "preparing the kernel Image";
    let image = match artifacts::kernel_format(&data) {
        KernelFormat::Raw => {
            ctx.say(&format!("/boot/{kname} is a raw (uncompressed) RISC-V Image, {} bytes: used as is", data.len()));
            data
        }
        KernelFormat::Compressed(method) => {
            ctx.say(&format!("/boot/{kname} is {method}-compressed: decompressing to a raw Image"));
            let prog = tool(if method == "gzip" {
                "gzip"
            } else if method == "zstd" {
                "zstd"
            } else {
                "xz"
            })?;
            decompress(step, &prog, &kfile)?
        }
        KernelFormat::ZBoot { offset, size, method } => {
            ctx.say(&format!("/boot/{kname} is an EFI zboot image ({method}): extracting the raw Image"));
            let prog = match method.as_str() {
                "gzip" => tool("gzip")?,
                "zstd" | "zstd22" => tool("zstd")?,
                "xz" | "lzma" => tool("xz")?,
                m => return Err(err(step, format!("unsupported zboot compression {m}"))),
            };
            let payload = data.get(offset..offset + size).ok_or_else(|| err(step, "zboot payload out of range"))?;
            let tmp = work.join("kernel.payload");
            fs::write(&tmp, payload).map_err(|e| err(step, e))?;
            decompress(step, &prog, &tmp)?
        }
        KernelFormat::Unknown => return Err(err(step, format!("/boot/{kname} is in an unknown format"))),
    };
    if !artifacts::is_riscv_image(&image) {
        return Err(err(step, "the kernel has no RISC-V Image header"));
    }
    fs::write(out.join("Image"), &image).map_err(|e| err(step, e))?;
    let config = fs::read_to_string(boot.join(format!("config-{version}"))).unwrap_or_default();
    if config.is_empty() {
        return Err(err(step, format!("/boot/config-{version} is missing")));
    }
    fs::write(out.join("config"), &config).map_err(|e| err(step, e))?;

    // ---- 3. firmware
    let step = "copying OpenSBI fw_dynamic.bin";
    let fw = stage.join("usr/lib/riscv64-linux-gnu/opensbi/generic/fw_dynamic.bin");
    fs::copy(&fw, out.join("fw_dynamic.bin")).map_err(|e| err(step, format!("{}: {e}", fw.display())))?;

    // ---- 4. modules
    ctx.step(3);
    let step = "resolving kernel modules";
    let moddir = stage.join("usr/lib/modules").join(&version);
    let moddir = if moddir.is_dir() { moddir } else { stage.join("lib/modules").join(&version) };
    if !moddir.is_dir() {
        return Err(err(step, format!("no module directory for {version}")));
    }
    for m in crate::ROOT_MODULES {
        let key = match *m {
            "virtio_mmio" => "VIRTIO_MMIO",
            "virtio_blk" => "VIRTIO_BLK",
            "virtio_net" => "VIRTIO_NET",
            "virtio_rng" => "HW_RANDOM_VIRTIO",
            "ext4" => "EXT4_FS",
            _ => continue,
        };
        ctx.say(&format!("CONFIG_{key}={}", artifacts::kconfig(&config, key).unwrap_or("(unset)")));
    }
    if !moddir.join("modules.dep").is_file() {
        ctx.say("running depmod (Debian ships no modules.dep)");
        run("running depmod", Command::new(tool("depmod")?).arg("-b").arg(&stage).arg(&version), Some(&log))?;
    }
    let read = |n: &str| fs::read_to_string(moddir.join(n)).unwrap_or_default();
    let db = ModuleDb::parse(
        &read("modules.dep"),
        &read("modules.softdep"),
        &read("modules.alias"),
        &read("modules.builtin"),
    );
    if db.modules.is_empty() {
        return Err(err(step, format!("{}/modules.dep is empty", moddir.display())));
    }
    let order = db.resolve(crate::ROOT_MODULES).map_err(|e| err(step, e))?;
    let names: Vec<String> = order.iter().map(|(n, _)| n.clone()).collect();
    ctx.say(&format!("initramfs modules (load order): {}", names.join(" ")));

    // ---- 5. initramfs
    ctx.step(4);
    let step = "building the initramfs";
    let busybox = stage.join("usr/bin/busybox");
    let bb = fs::read(&busybox).map_err(|e| err(step, format!("{}: {e}", busybox.display())))?;
    let applets = artifacts::busybox_applets(&bb).map_err(|e| err(step, e))?;
    for needed in ["sh", "mount", "insmod", "switch_root", "devmem", "base64", "ip", "setsid", "cttyhack", "usleep"] {
        if !applets.iter().any(|a| a == needed) {
            return Err(err(step, format!("busybox-static lacks the `{needed}` applet")));
        }
    }
    let xz = tool("xz")?;
    let mut cpio = CpioWriter::new(Vec::with_capacity(16 << 20));
    let c = |r: std::io::Result<()>| r.map_err(|e| err(step, e));
    for d in ["bin", "dev", "etc", "lib", "lib/modules", "newroot", "proc", "run", "sys", "tmp"] {
        c(cpio.dir(d, 0o755))?;
    }
    c(cpio.char_dev("dev/console", 0o600, 5, 1))?;
    c(cpio.char_dev("dev/null", 0o666, 1, 3))?;
    c(cpio.file("init", 0o755, crate::GUEST_INIT.as_bytes()))?;
    c(cpio.file("bin/busybox", 0o755, &bb))?;
    for a in applets.iter().filter(|a| a.as_str() != "busybox") {
        c(cpio.symlink(&format!("bin/{a}"), "busybox"))?;
    }
    let mut list = String::new();
    for (name, rel) in &order {
        let path = moddir.join(rel);
        let ko = match path.extension().and_then(|e| e.to_str()) {
            Some("xz") => decompress(step, &xz, &path)?,
            Some("zst") => decompress(step, &tool("zstd")?, &path)?,
            Some("gz") => decompress(step, &tool("gzip")?, &path)?,
            _ => fs::read(&path).map_err(|e| err(step, format!("{}: {e}", path.display())))?,
        };
        c(cpio.file(&format!("lib/modules/{name}.ko"), 0o644, &ko))?;
        list.push_str(name);
        list.push('\n');
    }
    c(cpio.file("etc/ftvm-modules", 0o644, list.as_bytes()))?;
    let cpio = cpio.finish().map_err(|e| err(step, e))?;
    let compression = if artifacts::kconfig(&config, "RD_ZSTD") == Some("y") {
        "zstd"
    } else if artifacts::kconfig(&config, "RD_GZIP") == Some("y") {
        "gzip"
    } else {
        "none"
    };
    let initrd = out.join("initrd.img");
    match compression {
        "zstd" => filter(step, &tool("zstd")?, &["-q", "-9", "-c"], &cpio, &initrd)?,
        "gzip" => filter(step, &tool("gzip")?, &["-9", "-n", "-c"], &cpio, &initrd)?,
        _ => fs::write(&initrd, &cpio).map_err(|e| err(step, e))?,
    }
    ctx.say(&format!(
        "initramfs: {} KiB cpio, {} KiB {compression}",
        cpio.len() / 1024,
        fs::metadata(&initrd).map(|m| m.len() / 1024).unwrap_or(0)
    ));

    // ---- 6. root filesystem
    ctx.step(5);
    let step = "preparing the root filesystem";
    prepare_root(&stage, &applets, spec).map_err(|e| err(step, e))?;
    for (n, add) in spec.adds.iter().enumerate() {
        ctx.say(&format!("adding {} at {} (after the configuration)", add.source.display(), add.dest));
        add_files(&add.source, &format!("{ADDS_DIR}/{n}"), &stage, &log)?;
    }
    if !spec.adds.is_empty() {
        let list: String = spec.adds.iter().enumerate().map(|(n, a)| format!("{n} {}\n", a.dest)).collect();
        fs::write(path_in_root(&stage, ADDS_DIR).map_err(|e| err(step, e))?.join("list"), list)
            .map_err(|e| err(step, e))?;
    }
    ctx.step(6);
    let step = "creating the ext4 root image (mke2fs)";
    // mke2fs fails with "Could not allocate block" halfway through a tree
    // that does not fit: say so first, with the sizes.
    let tree = tree_bytes(&stage);
    let room = spec.size / 100 * 90;
    if tree > room {
        return Err(err(
            step,
            format!(
                "the root's files take {} MiB, more than a {} MiB root disk holds: give a larger --size",
                tree >> 20,
                spec.size >> 20
            ),
        ));
    }
    ctx.say(&format!("rootfs.ext4: {} MiB of files in a {} MiB (sparse) disk", tree >> 20, spec.size >> 20));
    let rootfs = out.join("rootfs.ext4");
    run(
        step,
        Command::new(tool("mke2fs")?)
            .args(["-q", "-F", "-t", "ext4", "-L", "ftvm-root", "-m", "0"])
            .args(["-E", "lazy_itable_init=0,lazy_journal_init=1,root_owner=0:0"])
            .arg("-d")
            .arg(&stage)
            .arg(&rootfs)
            .arg(format!("{}k", spec.size / 1024)),
        Some(&log),
    )?;

    // ---- 7. the packages configured, in the guest
    ctx.step(7);
    configure(ctx, runner, &out, &rootfs, &log)?;

    // ---- 8. the root disk holds only what its filesystem uses
    ctx.step(8);
    let step = "compacting rootfs.ext4 (e2image)";
    // The configuration wrote every package's files anew over the
    // extracted ones and deleted the .debs: blocks the filesystem no longer
    // uses still hold data in the host's file, which every run's copy of
    // the disk would carry. e2image copies the used blocks only.
    let compact = out.join("rootfs.compact");
    run(step, Command::new(tool("e2image")?).arg("-ra").arg(&rootfs).arg(&compact), Some(&log))?;
    let used = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(p).map(|m| (m.blocks() * 512) >> 20).unwrap_or(0)
    };
    ctx.say(&format!("rootfs.ext4: {} MiB on the host's disk, from {} MiB", used(&compact), used(&rootfs)));
    fs::rename(&compact, &rootfs).map_err(|e| err(step, e))?;

    Ok(Stamp {
        recipe: crate::recipe_fingerprint(),
        kernel_version: version,
        mirror: mirror.to_string(),
        initrd_compression: compression.to_string(),
        build_seconds: 0.0,
        packages,
        initrd_modules: names,
        ..Default::default()
    })
}

/// Turn the extracted package tree into the root the guest configures:
/// ftvm's guest files, busybox's applets for what no package provides,
/// root's ssh keys.
fn prepare_root(root: &Path, applets: &[String], spec: &ImageSpec) -> std::io::Result<()> {
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("root", 0o700),
        ("mnt", 0o755),
        ("home", 0o755),
        ("usr/local/bin", 0o755),
    ] {
        let p = root.join(dir);
        fs::create_dir_all(&p)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
    }
    for (link, target) in [("var/run", "/run"), ("var/lock", "/run/lock")] {
        let p = root.join(link);
        if fs::symlink_metadata(&p).is_err() {
            symlink(target, p)?;
        }
    }
    // busybox applets for everything the packages do not provide
    for a in applets.iter().filter(|a| a.as_str() != "busybox") {
        if ["usr/bin", "usr/sbin", "bin", "sbin"].iter().any(|d| fs::symlink_metadata(root.join(d).join(a)).is_ok()) {
            continue;
        }
        symlink("busybox", root.join("usr/bin").join(a))?;
    }
    for (path, mode, text) in crate::GUEST_ROOT_FILES {
        let p = root.join(path);
        if let Some(dir) = p.parent() {
            fs::create_dir_all(dir)?;
        }
        let _ = fs::remove_file(&p);
        fs::write(&p, text)?;
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode))?;
    }
    let wants = root.join("usr/lib/systemd/system/sysinit.target.wants");
    fs::create_dir_all(&wants)?;
    for unit in crate::GUEST_SYSINIT_UNITS {
        let _ = fs::remove_file(wants.join(unit));
        symlink(format!("../{unit}"), wants.join(unit))?;
    }
    let masked = root.join("etc/systemd/system");
    fs::create_dir_all(&masked)?;
    for unit in crate::GUEST_MASKED_UNITS {
        let _ = fs::remove_file(masked.join(unit));
        symlink("/dev/null", masked.join(unit))?;
    }
    if !spec.ssh_keys.is_empty() {
        let ssh = root.join("root/.ssh");
        fs::create_dir_all(&ssh)?;
        fs::set_permissions(&ssh, fs::Permissions::from_mode(0o700))?;
        let keys: String = spec.ssh_keys.iter().map(|k| format!("{k}\n")).collect();
        fs::write(ssh.join("authorized_keys"), keys)?;
        fs::set_permissions(ssh.join("authorized_keys"), fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_names_the_package() {
        let e = tool("mke2fs-surely-not-installed").unwrap_err();
        assert_eq!(e.step, "checking host tools");
        assert!(e.cause.contains("install the Debian package"), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn guest_paths_stay_in_the_root() {
        let root = std::env::temp_dir().join(format!("ftvm-pathin-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::create_dir_all(root.join("run")).unwrap();
        symlink("/run", root.join("var-run")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("../../..", root.join("usr/lib/up")).unwrap();
        assert_eq!(path_in_root(&root, "/var-run/app").unwrap(), root.join("run/app"));
        assert_eq!(path_in_root(&root, "/lib/x").unwrap(), root.join("usr/lib/x"));
        assert_eq!(path_in_root(&root, "/lib/up/etc").unwrap(), root.join("etc"));
        assert_eq!(path_in_root(&root, "/opt/app").unwrap(), root.join("opt/app"));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn quoting_and_failing_commands() {
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
        let e = run("probing", Command::new("sh").args(["-c", "echo one; echo two >&2; exit 3"]), None).unwrap_err();
        assert_eq!(e.step, "probing");
        assert!(e.cause.contains("one | two"), "{e}");
        assert!(!e.to_string().contains('\n'));
    }
}

/// apt's words for a mirror whose index files do not match its Release.
fn mirror_mid_sync(apt_output: &str) -> bool {
    apt_output.lines().any(|l| {
        l.starts_with("E: Failed to fetch")
            && (l.contains("Mirror sync in progress")
                || l.contains("Hash Sum mismatch")
                || l.contains("unexpected size"))
    })
}

/// The `Codename:` of the (In)Release file apt fetched into `lists`, which
/// apt has checked against the archive key.
fn release_codename(lists: &Path) -> Option<String> {
    fs::read_dir(lists).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.ends_with("_InRelease") || name.ends_with("_Release")) {
            return None;
        }
        let text = fs::read_to_string(e.path()).ok()?;
        text.lines().find_map(|l| l.strip_prefix("Codename:")).map(|c| c.trim().to_string())
    })
}

#[cfg(test)]
mod mirror_sync_tests {
    use super::*;

    #[test]
    fn a_mid_sync_mirror_is_told_from_other_failures() {
        let mid = "E: Failed to fetch http://m/debian/dists/trixie/main/binary-riscv64/Packages.xz  \
                   File has unexpected size (9385284 != 9387120). Mirror sync in progress? [IP: 1.2.3.4 80]";
        assert!(mirror_mid_sync(mid));
        assert!(mirror_mid_sync("E: Failed to fetch http://m/x.xz  Hash Sum mismatch"));
        assert!(!mirror_mid_sync("E: Unable to locate package redis-server"));
        assert!(!mirror_mid_sync("W: Mirror sync in progress? (not an error)"));
    }

    #[test]
    fn the_codename_comes_from_the_fetched_release() {
        let dir = std::env::temp_dir().join(format!("ftvm-codename-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(release_codename(&dir), None);
        fs::write(dir.join("m_debian_dists_stable_InRelease"), "Origin: Debian\nSuite: stable\nCodename: trixie\n")
            .unwrap();
        fs::write(dir.join("m_debian_dists_stable_main_binary-riscv64_Packages"), "Codename: bogus\n").unwrap();
        assert_eq!(release_codename(&dir).as_deref(), Some("trixie"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
