//! Finding the Debian mirror from the machine's apt configuration.
//!
//! Order: an explicit mirror (from [`crate::BuildOptions::mirror`]), then the
//! environment variable `FTVM_DEBIAN_MIRROR`, then the first `deb` source in
//! `/etc/apt/sources.list` and `/etc/apt/sources.list.d/*.list|*.sources`
//! (one-line and deb822 formats) that looks like a Debian archive: a Debian
//! suite (codename or alias, no `-security`/`-updates` suffix), component
//! `main`, an `http`, `https`, `ftp` or `file` URI that is not a security
//! archive.

use std::path::Path;

/// One `deb` source entry (several per deb822 stanza are flattened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AptSource {
    /// Archive URI, e.g. `http://deb.debian.org/debian`.
    pub uri: String,
    /// Suite as written, e.g. `trixie`, `stable` or `trixie-updates`.
    pub suite: String,
    /// Components as written, e.g. `main` and `contrib`.
    pub components: Vec<String>,
}

const DEBIAN_SUITES: &[&str] = &[
    "stable",
    "testing",
    "unstable",
    "oldstable",
    "oldoldstable",
    "sid",
    "experimental",
    "buster",
    "bullseye",
    "bookworm",
    "trixie",
    "forky",
    "duke",
];

/// Parse the one-line format (`sources.list`, `*.list`).
pub fn parse_one_line(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line.strip_prefix("deb") {
            Some(r) if r.starts_with(char::is_whitespace) => r.trim_start(),
            _ => continue, // blank, comment, deb-src, garbage
        };
        if rest.starts_with('[') {
            match rest.find(']') {
                Some(end) => rest = rest[end + 1..].trim_start(),
                None => continue,
            }
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            continue;
        };
        out.push(AptSource {
            uri: uri.to_string(),
            suite: suite.to_string(),
            components: words.map(str::to_string).collect(),
        });
    }
    out
}

/// Parse the deb822 format (`*.sources`).
pub fn parse_deb822(text: &str) -> Vec<AptSource> {
    let mut out = Vec::new();
    let mut stanza: Vec<(String, String)> = Vec::new();
    let flush = |stanza: &mut Vec<(String, String)>, out: &mut Vec<AptSource>| {
        let get = |k: &str| {
            stanza
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let enabled = get("Enabled").first().map(|v| v.as_str() != "no").unwrap_or(true);
        if enabled && get("Types").iter().any(|t| t == "deb") {
            let comps = get("Components");
            for uri in get("URIs") {
                for suite in get("Suites") {
                    out.push(AptSource { uri: uri.clone(), suite, components: comps.clone() });
                }
            }
        }
        stanza.clear();
    };
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut stanza, &mut out);
        } else if line.starts_with([' ', '\t']) {
            if let Some((_, v)) = stanza.last_mut() {
                v.push(' ');
                v.push_str(line.trim());
            }
        } else if let Some((k, v)) = line.split_once(':') {
            stanza.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    flush(&mut stanza, &mut out);
    out
}

/// Whether a source looks like the main Debian archive.
pub fn is_debian_archive(src: &AptSource) -> bool {
    let uri = src.uri.trim_end_matches('/');
    let scheme_ok = ["http://", "https://", "ftp://", "file:/"].iter().any(|s| uri.starts_with(s));
    let suite = src.suite.trim_end_matches('/');
    scheme_ok
        && !uri.ends_with("-security")
        && !uri.contains("/debian-ports")
        && DEBIAN_SUITES.contains(&suite)
        && src.components.iter().any(|c| c == "main")
}

/// Pick the mirror from parsed sources: the first Debian archive, without a
/// trailing slash.
pub fn pick_mirror(sources: &[AptSource]) -> Option<String> {
    sources.iter().find(|s| is_debian_archive(s)).map(|s| s.uri.trim_end_matches('/').to_string())
}

/// Read and parse every apt source file under `root` (normally `/`).
pub fn read_apt_sources(root: &Path) -> Vec<AptSource> {
    let mut out = Vec::new();
    if let Ok(text) = std::fs::read_to_string(root.join("etc/apt/sources.list")) {
        out.extend(parse_one_line(&text));
    }
    let dir = root.join("etc/apt/sources.list.d");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    files.sort();
    for path in files {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if name.ends_with(".list") {
            out.extend(parse_one_line(&text));
        } else if name.ends_with(".sources") {
            out.extend(parse_deb822(&text));
        }
    }
    out
}

/// Resolve the mirror: `explicit`, else `$FTVM_DEBIAN_MIRROR`, else apt's
/// configuration under `apt_root`.
pub fn resolve(explicit: Option<&str>, env: Option<&str>, apt_root: &Path) -> Result<String, crate::ImageError> {
    for m in [explicit, env].into_iter().flatten() {
        let m = m.trim();
        if !m.is_empty() {
            return Ok(m.trim_end_matches('/').to_string());
        }
    }
    pick_mirror(&read_apt_sources(apt_root)).ok_or_else(|| {
        crate::ImageError::new(
            "finding the Debian mirror",
            format!(
                "no Debian archive source (main component, Debian suite) in {}/etc/apt/sources.list or sources.list.d; set FTVM_DEBIAN_MIRROR to a Debian mirror URL",
                apt_root.display().to_string().trim_end_matches('/')
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----
";

    #[test]
    fn deb822_stanzas() {
        let s = parse_deb822(DEB822);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].uri, "http://mirror.example/debian/");
        assert_eq!(s[0].suite, "bookworm");
        assert_eq!(s[1].suite, "bookworm-updates");
        assert_eq!(s[2].suite, "bookworm-security");
        assert_eq!(pick_mirror(&s).as_deref(), Some("http://mirror.example/debian"));
    }

    #[test]
    fn deb822_disabled_and_non_debian() {
        let text = "Types: deb\nURIs: https://nodes.example/node_20.x\nSuites: nodistro\nComponents: main\n\n\
                    Types: deb-src deb\nURIs: https://m2.example/debian\nSuites: trixie\nComponents: main contrib\nEnabled: no\n\n\
                    types: deb\nuris: https://m3.example/debian\nsuites: sid\ncomponents: main\n";
        let s = parse_deb822(text);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(pick_mirror(&s).as_deref(), Some("https://m3.example/debian"));
    }

    #[test]
    fn one_line_format() {
        let text = "# comment\n\
                    deb-src http://src.example/debian bookworm main\n\
                    deb [arch=amd64] https://cloud.example/apt cloud-sdk-bookworm main\n\
                    deb http://sec.example/debian-security bookworm-security main\n\
                    deb [signed-by=/usr/share/keyrings/k.gpg arch=amd64,arm64] http://ftp.example/debian/ bookworm main contrib # trailing\n";
        let s = parse_one_line(text);
        assert_eq!(s.len(), 3);
        assert_eq!(s[2].components, vec!["main", "contrib"]);
        assert_eq!(pick_mirror(&s).as_deref(), Some("http://ftp.example/debian"));
    }

    #[test]
    fn no_debian_source() {
        let s = parse_one_line("deb http://archive.ubuntu.example/ubuntu noble main\n");
        assert_eq!(pick_mirror(&s), None);
    }

    #[test]
    fn resolve_order_and_files() {
        let dir = std::env::temp_dir().join(format!("ftvm-mirror-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etc/apt/sources.list.d")).unwrap();
        std::fs::write(dir.join("etc/apt/sources.list.d/a.list.disabled"), "deb http://no.example/debian sid main\n")
            .unwrap();
        std::fs::write(dir.join("etc/apt/sources.list.d/b.sources"), DEB822).unwrap();
        assert_eq!(resolve(None, None, &dir).unwrap(), "http://mirror.example/debian");
        std::fs::write(dir.join("etc/apt/sources.list"), "deb http://first.example/debian trixie main\n").unwrap();
        assert_eq!(resolve(None, None, &dir).unwrap(), "http://first.example/debian");
        assert_eq!(resolve(None, Some("http://env.example/debian/"), &dir).unwrap(), "http://env.example/debian");
        assert_eq!(resolve(Some("file:///srv/m"), Some("http://env.example/d"), &dir).unwrap(), "file:///srv/m");
        std::fs::remove_dir_all(&dir).unwrap();
        let err = resolve(None, Some(" "), &dir).unwrap_err().to_string();
        assert!(err.starts_with("finding the Debian mirror: "), "{err}");
        assert!(err.contains("FTVM_DEBIAN_MIRROR"));
    }
}
