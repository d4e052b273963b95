//! Named images: what a user asks to be built (more Debian packages,
//! another root size, files of their own), and the images in the cache
//! (list, locate by name, remove).

use std::path::{Path, PathBuf};

use crate::{images_dir, locate_in, GuestImage, ImageError, Stamp, IMAGE_NAME, ROOTFS_SIZE};

/// Smallest root disk: the default packages alone need about 200 MiB.
const MIN_SIZE: u64 = 256 << 20;
/// Largest root disk (it is sparse: only what is written costs).
const MAX_SIZE: u64 = 1 << 40;
/// Longest image name.
const MAX_NAME: usize = 64;

/// A directory or tarball of the user's, put into the root at `dest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    /// A directory (its contents are copied) or a tar archive (extracted).
    pub source: PathBuf,
    /// Absolute path in the guest, e.g. `/opt/app`.
    pub dest: String,
    /// A digest of what the source holds (names, sizes, modes, times), so
    /// a build of the same files again is not needed.
    pub digest: u64,
}

impl Added {
    /// `SOURCE:/PATH`, as `--add` takes it and the stamp records it.
    pub fn parse(s: &str) -> Result<Added, ImageError> {
        let step = "reading --add";
        let (source, dest) = s.rsplit_once(':').ok_or_else(|| {
            ImageError::new(
                step,
                format!("'{s}' is not SOURCE:/PATH (a directory or tarball, then where in the guest)"),
            )
        })?;
        if source.is_empty() || !dest.starts_with('/') || dest.split('/').any(|c| c == "..") {
            return Err(ImageError::new(step, format!("'{s}': the guest path must be absolute, without `..`")));
        }
        let source = std::path::absolute(source).map_err(|e| ImageError::new(step, format!("{source}: {e}")))?;
        match std::fs::metadata(&source) {
            Ok(m) if m.is_dir() || m.is_file() => {}
            Ok(_) => {
                return Err(ImageError::new(step, format!("{} is neither a directory nor a file", source.display())))
            }
            Err(e) => return Err(ImageError::new(step, format!("{}: {e}", source.display()))),
        }
        let digest = tree_digest(&source);
        Ok(Added { source, dest: dest.to_string(), digest })
    }

    /// As the stamp records it: `SOURCE:/PATH DIGEST`.
    fn render(&self) -> String {
        format!("{}:{} {:016x}", self.source.display(), self.dest, self.digest)
    }
}

/// The digest of a directory tree or a file: each entry's path, size,
/// mode and modification time, in name order (what changes when a user
/// edits their files; their bytes are not read).
fn tree_digest(root: &Path) -> u64 {
    use crate::artifacts::{fnv1a, FNV_OFFSET};
    use std::os::unix::fs::MetadataExt;
    let mut h = FNV_OFFSET;
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(root.join(&rel)) else { continue };
        h = fnv1a(rel.as_os_str().as_encoded_bytes(), h);
        for n in [m.len(), m.mode() as u64, m.mtime() as u64, m.mtime_nsec() as u64] {
            h = fnv1a(&n.to_le_bytes(), h);
        }
        if m.is_dir() {
            let mut names: Vec<_> =
                std::fs::read_dir(root.join(&rel)).into_iter().flatten().flatten().map(|e| e.file_name()).collect();
            names.sort();
            todo.extend(names.into_iter().rev().map(|n| rel.join(n)));
        }
    }
    h
}

/// What to build: the default image, or a named one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// Directory name under `<cache>/images/`.
    pub name: String,
    /// Debian packages beyond [`crate::PACKAGES`] (apt resolves their
    /// dependencies and versions).
    pub packages: Vec<String>,
    /// Size of the (sparse) root disk in bytes.
    pub size: u64,
    /// The user's files, put into the root last (after the packages are
    /// configured, so a file of theirs replaces a package's).
    pub adds: Vec<Added>,
    /// Public keys root may log in with over ssh (lines of
    /// `/root/.ssh/authorized_keys`).
    pub ssh_keys: Vec<String>,
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            name: IMAGE_NAME.into(),
            packages: Vec::new(),
            size: ROOTFS_SIZE,
            adds: Vec::new(),
            ssh_keys: Vec::new(),
        }
    }
}

impl ImageSpec {
    /// The image `ftvm image build` options describe. With packages and no
    /// name, the name is the packages' (`python3-sqlite3`); with nothing
    /// but a name, the default recipe under that name. The default name
    /// holds only the default recipe, so what every plain `ftvm run` boots
    /// does not change under it.
    pub fn new(
        name: Option<&str>,
        packages: &[String],
        size: Option<&str>,
        adds: &[String],
    ) -> Result<Self, ImageError> {
        let step = "choosing the image";
        let mut wanted: Vec<String> = Vec::new();
        for p in packages.iter().flat_map(|p| p.split(',')).map(str::trim).filter(|p| !p.is_empty()) {
            check_package(p)?;
            if !crate::PACKAGES.contains(&p) && !wanted.iter().any(|w| w == p) {
                wanted.push(p.to_string());
            }
        }
        let size = size.map(parse_size).transpose()?.unwrap_or(ROOTFS_SIZE);
        let adds = adds.iter().map(|a| Added::parse(a)).collect::<Result<Vec<_>, _>>()?;
        let custom = !wanted.is_empty() || size != ROOTFS_SIZE || !adds.is_empty();
        let name = match name {
            Some(n) => n.to_string(),
            None if !wanted.is_empty() => wanted.join("-"),
            None if custom => {
                return Err(ImageError::new(
                    step,
                    "name the image with --name (the default image keeps the default recipe)",
                ))
            }
            None => IMAGE_NAME.to_string(),
        };
        check_name(&name)?;
        if name == IMAGE_NAME && custom {
            return Err(ImageError::new(
                step,
                format!(
                    "{IMAGE_NAME} is the default image, built from the default recipe: give this one another --name"
                ),
            ));
        }
        Ok(ImageSpec { name, packages: wanted, size, adds, ssh_keys: Vec::new() })
    }

    /// This spec with the public keys in `files` (OpenSSH's
    /// `authorized_keys` lines: a `.pub` file, or several keys a file) for
    /// root. Only a named image takes keys: the default one is everyone's.
    pub fn with_ssh_keys(mut self, files: &[PathBuf]) -> Result<Self, ImageError> {
        self.ssh_keys.extend(crate::seed::read_public_keys(files)?);
        if !self.ssh_keys.is_empty() && self.name == IMAGE_NAME {
            return Err(ImageError::new(
                "choosing the image",
                format!("{IMAGE_NAME} is the default image, built from the default recipe: give one with keys another --name"),
            ));
        }
        Ok(self)
    }

    /// The stamp's record of the keys: a digest each.
    fn key_digests(&self) -> Vec<String> {
        use crate::artifacts::{fnv1a, FNV_OFFSET};
        self.ssh_keys.iter().map(|k| format!("{:016x}", fnv1a(k.as_bytes(), FNV_OFFSET))).collect()
    }

    /// Whether an image built with `stamp` is this spec's: the same
    /// packages, size, and files added (as they are now).
    pub(crate) fn built_as(&self, stamp: &Stamp) -> bool {
        stamp.added == self.adds.iter().map(Added::render).collect::<Vec<_>>()
            && stamp.extra_packages == self.packages
            && stamp.rootfs_bytes() == self.size
            && stamp.ssh_keys == self.key_digests()
    }

    /// The stamp's record of this spec.
    pub(crate) fn stamp_fields(&self, stamp: &mut Stamp) {
        stamp.extra_packages = self.packages.clone();
        stamp.rootfs_size = if self.size == ROOTFS_SIZE && self.name == IMAGE_NAME { 0 } else { self.size };
        stamp.added = self.adds.iter().map(Added::render).collect();
        stamp.ssh_keys = self.key_digests();
    }
}

/// A size: `4G`, `1536M`, `1T`, or a plain number of MiB.
pub fn parse_size(s: &str) -> Result<u64, ImageError> {
    let step = "reading --size";
    let t = s.trim();
    let bad = || ImageError::new(step, format!("invalid size '{s}': use a number with M, G or T"));
    let (num, mult) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'M' => 1u64 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(bad()),
            };
            (&t[..t.len() - 1], m)
        }
        _ => (t, 1 << 20),
    };
    let bytes = num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(bad)?;
    if !(MIN_SIZE..=MAX_SIZE).contains(&bytes) {
        return Err(ImageError::new(step, format!("--size {s} is outside {}M..{}T", MIN_SIZE >> 20, MAX_SIZE >> 40)));
    }
    Ok(bytes)
}

/// A Debian package name (policy §5.6.1): lowercase letters, digits,
/// `+`, `-`, `.`, starting with a letter or digit. Anything else would be
/// an option to apt, or another package list.
fn check_package(p: &str) -> Result<(), ImageError> {
    let ok = p.len() >= 2
        && p.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ImageError::new("reading --packages", format!("'{p}' is not a Debian package name")))
    }
}

/// An image name: a directory of the cache, and a word in `--disk`-style
/// option lists, so letters, digits, `.`, `_`, `+`, `-` only.
pub fn check_name(name: &str) -> Result<(), ImageError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ImageError::new(
            "choosing the image",
            format!("'{name}' is not an image name (up to {MAX_NAME} letters, digits, `.`, `_`, `+`, `-`; not starting with `.`)"),
        ))
    }
}

/// The built image called `name`.
pub fn locate_named(name: &str) -> Result<GuestImage, ImageError> {
    locate_named_in(&images_dir(), name)
}

/// The built image called `name` in the images directory `images` (a
/// cluster agent's own, `ftvm agent --images`).
pub fn locate_named_in(images: &Path, name: &str) -> Result<GuestImage, ImageError> {
    check_name(name)?;
    let dir = images.join(name);
    if name != IMAGE_NAME && !dir.is_dir() {
        return Err(ImageError::new(
            "locating the guest image",
            format!("there is no image called {name} (`ftvm image list` shows those built)"),
        ));
    }
    locate_in(&dir).map(|(img, _)| img)
}

/// An image in the cache, as `ftvm image list` shows it.
#[derive(Debug, Clone)]
pub struct ImageInfo {
    /// Its name.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Bytes its files take on the disk (the root disk is sparse).
    pub disk_bytes: u64,
    /// Its stamp, or why it cannot be booted (half-built, outdated).
    pub stamp: Result<Stamp, ImageError>,
}

/// The images in the cache, by name.
pub fn list() -> Vec<ImageInfo> {
    list_in(&images_dir())
}

/// The images in the images directory `images`, by name.
pub fn list_in(images: &Path) -> Vec<ImageInfo> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<ImageInfo> = std::fs::read_dir(images)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            // .build-PID and .old-PID are builds under way (or interrupted)
            if name.starts_with('.') {
                return None;
            }
            let dir = e.path();
            let disk_bytes = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|f| f.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum();
            let stamp = locate_in(&dir).map(|(_, st)| st);
            Some(ImageInfo { name, dir, disk_bytes, stamp })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Remove the image called `name` (and the packages kept for rebuilding
/// it). Refused while a VM writes its root disk (`ftvm run --persist`).
pub fn remove(name: &str) -> Result<PathBuf, ImageError> {
    check_name(name)?;
    let step = "removing the image";
    let dir = images_dir().join(name);
    if !dir.is_dir() {
        return Err(ImageError::new(step, format!("there is no image called {name}")));
    }
    if in_use(&dir.join("rootfs.ext4")) {
        return Err(ImageError::new(step, format!("{name}'s root disk is in use by a VM")));
    }
    // Renamed away first, so nothing finds it half-removed.
    let old = images_dir().join(format!(".old-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&old);
    std::fs::rename(&dir, &old).map_err(|e| ImageError::new(step, format!("{}: {e}", dir.display())))?;
    std::fs::remove_dir_all(&old).map_err(|e| ImageError::new(step, format!("{}: {e}", old.display())))?;
    let _ = std::fs::remove_dir_all(crate::cache_dir().join("debs").join(name));
    Ok(dir)
}

/// Whether a VM holds `disk`'s lock (the flock(2) every VM takes on its
/// disks: exclusive for writing, shared for reading).
fn in_use(disk: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(disk) else {
        return false;
    };
    // SAFETY: flock on an open descriptor touches no memory; the lock goes
    // with the file when it closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_from_options() {
        let d = ImageSpec::new(None, &[], None, &[]).unwrap();
        assert_eq!(d, ImageSpec::default());
        let s = ImageSpec::new(None, &["python3,sqlite3".into(), "redis-server".into()], Some("4G"), &[]).unwrap();
        assert_eq!(s.name, "python3-sqlite3");
        assert_eq!(s.packages, ["python3", "sqlite3"], "the default's packages are not extra");
        assert_eq!(s.size, 4 << 30);
        let e = ImageSpec::new(None, &[], Some("2G"), &[]).unwrap_err().to_string();
        assert!(e.contains("--name"), "{e}");
        let e = ImageSpec::new(Some(IMAGE_NAME), &["python3".into()], None, &[]).unwrap_err().to_string();
        assert!(e.contains("default image"), "{e}");
        assert!(ImageSpec::new(Some("a/b"), &[], None, &[]).is_err());
        assert!(ImageSpec::new(Some(".hidden"), &[], None, &[]).is_err());
        assert!(ImageSpec::new(Some("web"), &["--allow-unauthenticated".into()], None, &[]).is_err());
        assert!(ImageSpec::new(Some("web"), &["Python3".into()], None, &[]).is_err());
        assert!(ImageSpec::new(Some("web"), &["libstdc++6".into()], None, &[]).is_ok());
        let e = ImageSpec::new(Some("web"), &[], None, &["/surely/not/here:/opt".into()]).unwrap_err();
        assert!(e.to_string().contains("/surely/not/here"), "{e}");
        assert!(ImageSpec::new(Some("web"), &[], None, &["/tmp:opt".into()]).is_err());
        assert!(ImageSpec::new(Some("web"), &[], None, &["/tmp:/opt/../etc".into()]).is_err());
        let a = ImageSpec::new(Some("web"), &[], None, &["/tmp:/opt/t".into()]).unwrap();
        assert_eq!((a.adds[0].source.to_str(), a.adds[0].dest.as_str()), (Some("/tmp"), "/opt/t"));
    }

    #[test]
    fn files_added_are_built_again_only_when_they_change() {
        let dir = std::env::temp_dir().join(format!("ftvm-spec-add-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/a"), b"one").unwrap();
        let add = [format!("{}:/opt/a", dir.display())];
        let spec = ImageSpec::new(Some("web"), &[], None, &add).unwrap();
        let mut st = Stamp::default();
        spec.stamp_fields(&mut st);
        assert!(ImageSpec::new(Some("web"), &[], None, &add).unwrap().built_as(&st));
        assert!(!ImageSpec::new(Some("web"), &[], None, &[]).unwrap().built_as(&st), "the files were dropped");
        std::fs::write(dir.join("sub/a"), b"three").unwrap();
        assert!(!ImageSpec::new(Some("web"), &[], None, &add).unwrap().built_as(&st), "a file changed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("1536m").unwrap(), 1536 << 20);
        assert_eq!(parse_size("512").unwrap(), 512 << 20);
        assert!(parse_size("100M").unwrap_err().to_string().contains("outside"));
        assert!(parse_size("2P").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn a_spec_matches_the_stamp_it_wrote() {
        let spec = ImageSpec::new(Some("py"), &["python3".into()], Some("2G"), &[]).unwrap();
        let mut st = Stamp::default();
        spec.stamp_fields(&mut st);
        assert!(spec.built_as(&st));
        let parsed = Stamp::parse(&format!("format=1\nrecipe=1-x\nkernel_version=6\n{}", {
            let mut s = Stamp { recipe: "1-x".into(), kernel_version: "6".into(), ..Default::default() };
            spec.stamp_fields(&mut s);
            s.render()
                .lines()
                .filter(|l| l.starts_with("extra") || l.starts_with("rootfs"))
                .collect::<Vec<_>>()
                .join("\n")
        }))
        .unwrap();
        assert!(spec.built_as(&parsed));
        let other = ImageSpec::new(Some("py"), &["python3".into(), "sqlite3".into()], Some("2G"), &[]).unwrap();
        assert!(!other.built_as(&st));
        // the default image's stamp (no size written) is the default spec's
        let mut def = Stamp::default();
        ImageSpec::default().stamp_fields(&mut def);
        assert_eq!(def.rootfs_size, 0);
        assert!(ImageSpec::default().built_as(&def));
    }
}
