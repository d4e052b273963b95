#![deny(missing_docs)]

//! `ftvm-image`: the default guest for ftvm — Debian trixie riscv64 booted
//! like QEMU's `virt` board.
//!
//! [`build`] assembles, from Debian packages fetched with `mmdebstrap`
//! (`--variant=extract`, riscv64, the mirror from apt's configuration):
//!
//! * `Image` — the kernel of the current `linux-image-riscv64` dependency.
//!   Debian ships it for riscv64 as `/boot/vmlinux-<version>`: an
//!   *uncompressed* RISC-V Image with an EFI-stub PE header, which both
//!   QEMU's and ftvm's loaders take as-is. (Compressed or EFI-zboot kernels
//!   are decompressed to a raw Image.)
//! * `fw_dynamic.bin` — OpenSBI's generic-platform `fw_dynamic` firmware from
//!   Debian's `opensbi` package, loaded in M-mode as the `-bios`.
//! * `initrd.img` — a zstd (or gzip, per the kernel config) newc cpio with
//!   busybox (`busybox-static`), the modules the root needs (virtio_mmio,
//!   virtio_blk, virtio_net, ext4 and their hard/soft dependencies, from
//!   `depmod`'s modules.dep), and `/init` (`guest/init`).
//! * `rootfs.ext4` — a 1 GiB sparse ext4 root: Debian's essential packages,
//!   apt, systemd as init, redis (server + tools), iperf3, the kernel's
//!   modules, busybox's applets for every command no package provides, and
//!   ftvm's own guest files (`guest/`: the exec command's service, this
//!   VM's settings at boot, the RTC follower). Every package is
//!   *configured*, as `apt install` leaves it: the build boots the
//!   extracted root once on ftvm itself and installs the packages there
//!   with dpkg and apt (`guest/lib/configure`), through the [`GuestRunner`]
//!   its front end gives it.
//!
//! The guest protocol (command line, markers, exit status) is in [`protocol`]
//! and `guest/README.md`.
//!
//! Images live in `<cache_dir()>/images/<name>/` (the default one is
//! `trixie-riscv64`) with a stamp file listing the resolved package
//! versions; a build goes to a temporary directory renamed into place at
//! the end, so [`locate`] never sees a half-built image. A named image
//! ([`ImageSpec`]) is the default recipe with more Debian packages, another
//! root size, or the user's own files added to the root ([`list`],
//! [`locate_named`], [`remove`]). A run's root disk and a pair's shared
//! disk are copies ([`copy`]): the cached images are never written.

pub mod artifacts;
pub mod base64;
mod build;
pub mod copy;
pub mod cpio;
pub mod essential;
mod grow;
pub mod mirror;
pub mod modules;
pub mod protocol;
pub mod seed;
mod spec;

use std::fmt;
use std::path::{Path, PathBuf};

pub use grow::grow_disk;
pub use protocol::{kernel_cmdline, EXEC_BEGIN_MARKER, EXEC_STATUS_PREFIX};
pub use spec::{
    check_name, list, list_in, locate_named, locate_named_in, parse_size, remove, Added, ImageInfo, ImageSpec,
};

/// Debian suite the default image is built from.
pub const SUITE: &str = "trixie";
/// The mirror's other name for [`SUITE`], tried when the mirror is mid-sync.
pub const SUITE_ALIAS: &str = "stable";
/// Guest architecture (Debian name).
pub const ARCH: &str = "riscv64";
/// Directory name of the default image under `<cache>/images/`.
pub const IMAGE_NAME: &str = "trixie-riscv64";
/// Stamp file written last into a finished image directory.
pub const STAMP_FILE: &str = "ftvm-image.stamp";
/// Bump when the build recipe changes in a way the guest files don't show.
pub const RECIPE_VERSION: u32 = 2;
/// Debian packages of every image (dependencies resolved by apt), beside
/// the Essential:yes ones ([`ESSENTIAL`]): the kernel and firmware the
/// host boots, apt (which configures the rest), systemd as init with udev,
/// iproute2 and netbase (the network), and the appliance's own (busybox's
/// applets, redis, iperf3).
pub const PACKAGES: &[&str] = &[
    "linux-image-riscv64",
    "opensbi",
    "apt",
    "systemd-sysv",
    "udev",
    "iproute2",
    "netbase",
    "busybox-static",
    "redis-server",
    "redis-tools",
    "iperf3",
];
/// The apt pattern of Debian's Essential:yes packages, which every image
/// has, as every Debian system does.
pub const ESSENTIAL: &str = "?essential";
/// Modules the initramfs loads (plus their dependencies) when not built in.
pub const ROOT_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_net", "virtio_rng", "ext4"];
/// Size of the sparse ext4 root image.
pub const ROOTFS_SIZE: u64 = 1 << 30;

pub(crate) const GUEST_INIT: &str = include_str!("../../../guest/init");
/// The guest's minimal init: what the configuration boot runs as PID 1.
pub(crate) const MINIMAL_INIT: &str = "/usr/lib/ftvm/ftvm-init";
/// The configuration script that boot runs (`guest/lib/configure`).
pub(crate) const CONFIGURE_COMMAND: &str = "/usr/lib/ftvm/configure";
/// ftvm's files in the root, put there before the packages are configured
/// (a package's file of the same path wins, but none has one; an `/etc`
/// file is a conffile dpkg keeps): (path, mode, contents).
pub(crate) const GUEST_ROOT_FILES: &[(&str, u32, &str)] = &[
    ("usr/lib/ftvm/ftvm-init", 0o755, include_str!("../../../guest/ftvm-init")),
    ("usr/lib/ftvm/configure", 0o755, include_str!("../../../guest/lib/configure")),
    ("usr/lib/ftvm/exec", 0o755, include_str!("../../../guest/lib/exec")),
    ("usr/lib/ftvm/exec-done", 0o755, include_str!("../../../guest/lib/exec-done")),
    ("usr/lib/ftvm/setup", 0o755, include_str!("../../../guest/lib/setup")),
    ("usr/lib/ftvm/rtc-follow", 0o755, include_str!("../../../guest/lib/rtc-follow")),
    ("usr/lib/systemd/system/ftvm-exec.target", 0o644, include_str!("../../../guest/systemd/ftvm-exec.target")),
    ("usr/lib/systemd/system/ftvm-exec.service", 0o644, include_str!("../../../guest/systemd/ftvm-exec.service")),
    ("usr/lib/systemd/system/ftvm-setup.service", 0o644, include_str!("../../../guest/systemd/ftvm-setup.service")),
    ("usr/lib/systemd/system/ftvm-rtc.service", 0o644, include_str!("../../../guest/systemd/ftvm-rtc.service")),
    (
        "usr/lib/systemd/system-generators/ftvm-exec-generator",
        0o755,
        include_str!("../../../guest/systemd/ftvm-exec-generator"),
    ),
    (
        "usr/lib/systemd/system-shutdown/ftvm-exec-status",
        0o755,
        include_str!("../../../guest/systemd/ftvm-exec-status"),
    ),
    ("usr/lib/sysctl.d/90-ftvm.conf", 0o644, include_str!("../../../guest/systemd/90-ftvm.conf")),
    (
        "etc/systemd/system/serial-getty@.service.d/ftvm-autologin.conf",
        0o644,
        include_str!("../../../guest/systemd/ftvm-autologin.conf"),
    ),
    ("etc/hostname", 0o644, include_str!("../../../guest/rootfs/etc/hostname")),
    ("etc/hosts", 0o644, include_str!("../../../guest/rootfs/etc/hosts")),
    ("etc/fstab", 0o644, include_str!("../../../guest/rootfs/etc/fstab")),
    ("etc/resolv.conf", 0o644, include_str!("../../../guest/rootfs/etc/resolv.conf")),
    ("etc/redis/redis.conf", 0o644, include_str!("../../../guest/rootfs/etc/redis/redis.conf")),
];
/// ftvm's services that run on every boot, wanted by `sysinit.target`
/// (links in the vendor directory, as systemd's own units are enabled).
pub(crate) const GUEST_SYSINIT_UNITS: &[&str] = &["ftvm-setup.service", "ftvm-rtc.service"];
/// systemd's units an ftvm guest never runs (masked: linked to /dev/null
/// in /etc/systemd/system). systemd-firstboot asks on the console for a
/// locale, a time zone and a root password on a VM's first boot (its
/// machine-id is still to be made): nobody answers a VM's console then,
/// and an --exec run would wait forever; a VM's own settings come from
/// its seed (ftvm-setup.service). systemd-networkd-wait-online waits
/// (2 minutes, then fails) for links systemd-networkd manages, and it
/// manages none: eth0 is ftvm-setup's (network-online.target follows it),
/// so every service that wants the network online (nginx) waited those
/// minutes, and the system was `degraded`.
pub(crate) const GUEST_MASKED_UNITS: &[&str] = &["systemd-firstboot.service", "systemd-networkd-wait-online.service"];

/// A built guest image: everything `ftvm run` (or QEMU) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImage {
    /// Raw RISC-V kernel `Image`.
    pub kernel: PathBuf,
    /// Compressed newc initramfs.
    pub initrd: PathBuf,
    /// ext4 root disk image (attach as virtio-blk, it becomes `/dev/vda`).
    pub rootfs: PathBuf,
    /// OpenSBI `fw_dynamic.bin` (generic platform).
    pub firmware: PathBuf,
    /// Kernel release, e.g. `6.12.107+deb13-riscv64`.
    pub kernel_version: String,
}

/// Options for [`build`].
#[derive(Clone, Default)]
pub struct BuildOptions {
    /// Rebuild even if a complete, current image exists.
    pub force: bool,
    /// Debian mirror URL; default `$FTVM_DEBIAN_MIRROR`, then apt's sources.
    pub mirror: Option<String>,
    /// What to build: the default image unless told otherwise.
    pub spec: ImageSpec,
    /// Told each step, the bytes of packages at hand, and notes, as the
    /// build goes (the front end draws them; nothing is printed here).
    pub progress: Option<Reporter>,
    /// Boots the root once to configure its packages (see [`GuestRunner`]);
    /// a build without one fails before it fetches anything.
    pub runner: Option<std::sync::Arc<dyn GuestRunner>>,
}

/// A boot of the image under construction, to run one command in it (the
/// packages' configuration, `guest/lib/configure`): the image crate knows
/// no emulator, so the front end driving the build gives one (ftvm's
/// command line boots it on ftvm itself).
#[derive(Debug, Clone, Copy)]
pub struct GuestBoot<'a> {
    /// OpenSBI `fw_dynamic.bin`.
    pub firmware: &'a Path,
    /// The kernel `Image`.
    pub kernel: &'a Path,
    /// The initramfs.
    pub initrd: &'a Path,
    /// The root disk, written by the guest.
    pub disk: &'a Path,
    /// The kernel command line (the console, the init to run).
    pub cmdline: &'a str,
    /// The command, run as root with `/bin/sh -c` in exec mode.
    pub command: &'a str,
}

/// Runs a [`GuestBoot`] (see [`BuildOptions::runner`]).
pub trait GuestRunner: Send + Sync {
    /// Boots `boot`, runs its command, and returns the command's exit
    /// status; `line` hears each line the command prints, as it comes.
    /// An error is a boot that could not run at all, in one line.
    fn run(&self, boot: &GuestBoot<'_>, line: &mut dyn FnMut(&str)) -> Result<i32, String>;
}

impl fmt::Debug for dyn GuestRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GuestRunner")
    }
}

/// Hears a build's progress (see [`Progress`]).
pub type Reporter = std::sync::Arc<dyn Fn(Progress<'_>) + Send + Sync>;

/// What a build tells its [`Reporter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// Step `number` of `of` begins.
    Step {
        /// From 1.
        number: usize,
        /// How many steps the build has.
        of: usize,
        /// What the step does, e.g. `fetching packages`.
        what: &'a str,
    },
    /// Bytes of Debian packages at hand so far (downloaded, or kept from
    /// the last build), while they are fetched.
    Bytes(u64),
    /// A line about the build (a package tool's own step, the kernel
    /// found, sizes).
    Note(&'a str),
}

/// A failed step: displays as one line `"<step>: <cause>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    /// What was being done, e.g. `locating the guest image`.
    pub step: String,
    /// Why it failed.
    pub cause: String,
}

impl ImageError {
    /// The error of `step` failing because of `cause`.
    pub fn new(step: impl Into<String>, cause: impl Into<String>) -> Self {
        ImageError { step: step.into(), cause: cause.into() }
    }
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.step, self.cause)
    }
}

impl std::error::Error for ImageError {}

/// ftvm's cache directory: `$FTVM_CACHE_DIR`, else `$XDG_CACHE_HOME/ftvm`,
/// else `$HOME/.cache/ftvm`.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("FTVM_CACHE_DIR") {
        return d;
    }
    if let Some(d) = var("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return d.join("ftvm");
    }
    match var("HOME") {
        Some(h) => h.join(".cache/ftvm"),
        None => std::env::temp_dir().join("ftvm-cache"),
    }
}

/// Directory of the default image: `<cache_dir()>/images/trixie-riscv64`.
pub fn image_dir() -> PathBuf {
    images_dir().join(IMAGE_NAME)
}

/// Directory of every image: `<cache_dir()>/images`.
pub fn images_dir() -> PathBuf {
    cache_dir().join("images")
}

/// The contents of an image's stamp file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Stamp {
    /// [`recipe_fingerprint`] of the recipe that built the image.
    pub recipe: String,
    /// Kernel release, as in [`GuestImage::kernel_version`].
    pub kernel_version: String,
    /// Debian mirror URL the packages came from.
    pub mirror: String,
    /// How `initrd.img` is compressed: `zstd`, `gzip` or `none`.
    pub initrd_compression: String,
    /// Wall-clock time the build took, in seconds.
    pub build_seconds: f64,
    /// Every extracted package with its version, sorted by name.
    pub packages: Vec<(String, String)>,
    /// Modules in the initramfs, in load order.
    pub initrd_modules: Vec<String>,
    /// Packages asked for beyond [`PACKAGES`] (a named image's).
    pub extra_packages: Vec<String>,
    /// Size of `rootfs.ext4` in bytes (0 in stamps of images built before
    /// it was written: [`ROOTFS_SIZE`]).
    pub rootfs_size: u64,
    /// The user's files added to the root, as `SOURCE:/PATH DIGEST`.
    pub added: Vec<String>,
    /// Digests of the public keys root may log in with over ssh.
    pub ssh_keys: Vec<String>,
}

impl Stamp {
    pub(crate) fn render(&self) -> String {
        let mut s = format!(
            "format=1\nsuite={SUITE}\narch={ARCH}\nrecipe={}\nkernel_version={}\nmirror={}\ninitrd_compression={}\nbuild_seconds={:.1}\ninitrd_modules={}\n",
            self.recipe,
            self.kernel_version,
            self.mirror,
            self.initrd_compression,
            self.build_seconds,
            self.initrd_modules.join(",")
        );
        // Written only when set, so the default image's stamp reads as
        // it did before named images.
        if !self.extra_packages.is_empty() {
            s.push_str(&format!("extra_packages={}\n", self.extra_packages.join(",")));
        }
        if self.rootfs_size != 0 {
            s.push_str(&format!("rootfs_size={}\n", self.rootfs_size));
        }
        for a in &self.added {
            s.push_str(&format!("added={a}\n"));
        }
        for k in &self.ssh_keys {
            s.push_str(&format!("ssh_key={k}\n"));
        }
        for (p, v) in &self.packages {
            s.push_str(&format!("package {p} {v}\n"));
        }
        s
    }

    /// The root disk's size.
    pub fn rootfs_bytes(&self) -> u64 {
        if self.rootfs_size == 0 {
            ROOTFS_SIZE
        } else {
            self.rootfs_size
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Stamp> {
        let mut st = Stamp::default();
        let mut format_ok = false;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("package ") {
                let (p, v) = rest.split_once(' ')?;
                st.packages.push((p.into(), v.into()));
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k {
                "format" => format_ok = v == "1",
                "recipe" => st.recipe = v.into(),
                "kernel_version" => st.kernel_version = v.into(),
                "mirror" => st.mirror = v.into(),
                "initrd_compression" => st.initrd_compression = v.into(),
                "build_seconds" => st.build_seconds = v.parse().unwrap_or(0.0),
                "initrd_modules" => {
                    st.initrd_modules = v.split(',').filter(|s| !s.is_empty()).map(String::from).collect()
                }
                "extra_packages" => {
                    st.extra_packages = v.split(',').filter(|s| !s.is_empty()).map(String::from).collect()
                }
                "rootfs_size" => st.rootfs_size = v.parse().unwrap_or(0),
                "added" => st.added.push(v.into()),
                "ssh_key" => st.ssh_keys.push(v.into()),
                _ => {}
            }
        }
        (format_ok && !st.kernel_version.is_empty() && !st.recipe.is_empty()).then_some(st)
    }
}

/// Fingerprint of the recipe: the version, the package and module lists and
/// every guest file. An image with another fingerprint is outdated.
pub fn recipe_fingerprint() -> String {
    use artifacts::{fnv1a, FNV_OFFSET};
    let mut h = fnv1a(&RECIPE_VERSION.to_le_bytes(), FNV_OFFSET);
    for p in PACKAGES.iter().chain(ROOT_MODULES) {
        h = fnv1a(p.as_bytes(), h);
        h = fnv1a(b"\0", h);
    }
    h = fnv1a(GUEST_INIT.as_bytes(), h);
    h = fnv1a(ESSENTIAL.as_bytes(), h);
    for u in GUEST_SYSINIT_UNITS {
        h = fnv1a(u.as_bytes(), h);
    }
    h = fnv1a(b"masked\0", h);
    for u in GUEST_MASKED_UNITS {
        h = fnv1a(u.as_bytes(), h);
    }
    for (p, m, c) in GUEST_ROOT_FILES {
        h = fnv1a(p.as_bytes(), h);
        h = fnv1a(&m.to_le_bytes(), h);
        h = fnv1a(c.as_bytes(), h);
    }
    format!("{RECIPE_VERSION}-{h:016x}")
}

const ARTIFACTS: [&str; 4] = ["Image", "initrd.img", "rootfs.ext4", "fw_dynamic.bin"];

/// Check `dir` holds a complete image of the current recipe.
pub(crate) fn locate_in(dir: &Path) -> Result<(GuestImage, Stamp), ImageError> {
    let step = "locating the guest image";
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hint = if name == IMAGE_NAME {
        "run `ftvm image build`".to_string()
    } else {
        format!("run `ftvm image build --name {name}` with its packages")
    };
    let stamp_path = dir.join(STAMP_FILE);
    let text = std::fs::read_to_string(&stamp_path)
        .map_err(|_| ImageError::new(step, format!("no built image in {} ({hint})", dir.display())))?;
    let stamp = Stamp::parse(&text)
        .ok_or_else(|| ImageError::new(step, format!("{} is unreadable ({hint} --force)", stamp_path.display())))?;
    if stamp.recipe != recipe_fingerprint() {
        return Err(ImageError::new(
            step,
            format!("the image in {} was built by another recipe version ({hint} to rebuild)", dir.display()),
        ));
    }
    for a in ARTIFACTS {
        let p = dir.join(a);
        match std::fs::metadata(&p) {
            Ok(m) if m.len() > 0 => {}
            _ => return Err(ImageError::new(step, format!("{} is missing or empty ({hint} --force)", p.display()))),
        }
    }
    let img = GuestImage {
        kernel: dir.join("Image"),
        initrd: dir.join("initrd.img"),
        rootfs: dir.join("rootfs.ext4"),
        firmware: dir.join("fw_dynamic.bin"),
        kernel_version: stamp.kernel_version.clone(),
    };
    Ok((img, stamp))
}

/// The built default image, or an error telling to run `ftvm image build`.
pub fn locate() -> Result<GuestImage, ImageError> {
    locate_in(&image_dir()).map(|(img, _)| img)
}

/// The stamp (resolved package versions etc.) of the built default image.
pub fn stamp() -> Result<Stamp, ImageError> {
    locate_in(&image_dir()).map(|(_, st)| st)
}

/// Copy a disk image, leaving holes as holes (a reflink where the
/// filesystem has them, see [`copy::clone_disk`]): a fresh copy of the
/// 1 GiB root disk for one VM run costs only the blocks in use.
pub fn sparse_copy(src: &Path, dst: &Path) -> std::io::Result<()> {
    copy::clone_disk(src, dst).map(|_| ())
}

/// Build the image `opts.spec` describes (or return the cached one, if it
/// was built from the same spec, unless `opts.force`).
pub fn build(opts: &BuildOptions) -> Result<GuestImage, ImageError> {
    build::build(opts, &images_dir().join(&opts.spec.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_roundtrip() {
        let st = Stamp {
            recipe: recipe_fingerprint(),
            kernel_version: "6.12.1+deb13-riscv64".into(),
            mirror: "http://m.example/debian".into(),
            initrd_compression: "zstd".into(),
            build_seconds: 12.5,
            packages: vec![("busybox-static".into(), "1:1.37.0-6".into()), ("redis-server".into(), "5:8.0.2-3".into())],
            initrd_modules: vec!["crc16".into(), "ext4".into()],
            ..Default::default()
        };
        assert_eq!(Stamp::parse(&st.render()), Some(st.clone()));
        assert!(!st.render().contains("extra_packages"), "a default image's stamp is as before");
        let named = Stamp {
            extra_packages: vec!["python3".into(), "sqlite3".into()],
            rootfs_size: 4 << 30,
            added: vec!["/home/u/app:/opt/app".into()],
            ..st
        };
        assert_eq!(Stamp::parse(&named.render()), Some(named));
        assert_eq!(Stamp::parse("format=2\nrecipe=x\nkernel_version=y\n"), None);
    }

    #[test]
    fn locate_checks_stamp_and_files() {
        let dir = std::env::temp_dir().join(format!("ftvm-locate-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let err = locate_in(&dir).unwrap_err().to_string();
        assert!(err.contains("ftvm image build"), "{err}");
        let st = Stamp { recipe: recipe_fingerprint(), kernel_version: "6.12.1".into(), ..Default::default() };
        std::fs::write(dir.join(STAMP_FILE), st.render()).unwrap();
        for a in ARTIFACTS {
            std::fs::write(dir.join(a), b"x").unwrap();
        }
        let (img, _) = locate_in(&dir).unwrap();
        assert_eq!(img.kernel_version, "6.12.1");
        assert_eq!(img.rootfs, dir.join("rootfs.ext4"));
        std::fs::write(dir.join("Image"), b"").unwrap();
        assert!(locate_in(&dir).unwrap_err().to_string().contains("Image is missing or empty"));
        let old = Stamp { recipe: "0-0".into(), ..st };
        std::fs::write(dir.join(STAMP_FILE), old.render()).unwrap();
        assert!(locate_in(&dir).unwrap_err().to_string().contains("another recipe"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cache_dir_env() {
        // only checks the FTVM_CACHE_DIR branch without touching the others
        if std::env::var_os("FTVM_CACHE_DIR").is_none() {
            let d = cache_dir();
            assert!(d.ends_with("ftvm") || d.ends_with("ftvm-cache"), "{}", d.display());
        }
    }
}
