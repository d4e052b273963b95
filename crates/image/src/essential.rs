//! Which of a build's packages make the essential set: the Essential:yes
//! packages and what they depend on, among the packages fetched. The
//! guest installs these first with `dpkg --force-depends` (they work
//! unpacked, which is what lets dpkg run at all), then the rest with apt
//! (mmdebstrap(1), "OPERATION"). Worked out here, on the host, from the
//! packages' control fields: in the guest it took apt minutes of the
//! emulated CPU to parse the archive's index for the same answer.

use std::collections::{BTreeMap, BTreeSet};

/// A package's control fields that matter here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Control {
    /// `Package`.
    pub name: String,
    /// `Essential: yes`.
    pub essential: bool,
    /// `Pre-Depends` and `Depends`: each a list of alternatives, by name.
    pub depends: Vec<Vec<String>>,
    /// `Provides`, by name.
    pub provides: Vec<String>,
}

impl Control {
    /// Reads the fields from a control file's text (`dpkg-deb -f DEB`).
    pub fn parse(text: &str) -> Control {
        let mut c = Control::default();
        // Fields may continue on lines that start with a space.
        let mut fields: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if line.starts_with([' ', '\t']) {
                if let Some((_, v)) = fields.last_mut() {
                    v.push(' ');
                    v.push_str(line.trim());
                }
            } else if let Some((k, v)) = line.split_once(':') {
                fields.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let names = |v: &str| -> Vec<String> {
            v.split('|')
                .map(|alt| {
                    // `name:any (>= 1.0) [arch] <profile>`: the name only
                    let word = alt.trim().split([' ', '(', '[', '<']).next().unwrap_or("");
                    word.split(':').next().unwrap_or("").to_string()
                })
                .filter(|n| !n.is_empty())
                .collect()
        };
        for (k, v) in fields {
            match k.as_str() {
                "package" => c.name = v,
                "essential" => c.essential = v.eq_ignore_ascii_case("yes"),
                "depends" | "pre-depends" => c.depends.extend(v.split(',').map(names).filter(|a| !a.is_empty())),
                "provides" => c.provides.extend(v.split(',').flat_map(names)),
                _ => {}
            }
        }
        c
    }
}

/// The names of the essential set among `packages`: every Essential:yes
/// one, and for each dependency of one in the set, its first alternative
/// that is among `packages` (by name, or by what a package provides).
pub fn closure(packages: &[Control]) -> BTreeSet<String> {
    let by_name: BTreeMap<&str, &Control> = packages.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut provider: BTreeMap<&str, &str> = BTreeMap::new();
    for c in packages {
        for p in &c.provides {
            provider.entry(p.as_str()).or_insert(c.name.as_str());
        }
    }
    let mut set: BTreeSet<String> = BTreeSet::new();
    let mut todo: Vec<&str> = packages.iter().filter(|c| c.essential).map(|c| c.name.as_str()).collect();
    while let Some(name) = todo.pop() {
        if !set.insert(name.to_string()) {
            continue;
        }
        let Some(c) = by_name.get(name) else { continue };
        for alternatives in &c.depends {
            let chosen = alternatives.iter().find_map(|a| {
                by_name.get(a.as_str()).map(|c| c.name.as_str()).or_else(|| provider.get(a.as_str()).copied())
            });
            if let Some(dep) = chosen {
                if !set.contains(dep) {
                    todo.push(dep);
                }
            }
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_fields_are_read_as_names() {
        let c = Control::parse(
            "Package: coreutils\nEssential: yes\nPre-Depends: libacl1 (>= 2.2.23), libc6 (>= 2.38)\n\
             Depends: libgmp10:any | libgmp-alt,\n foo [riscv64] <!nocheck>\nProvides: coreutils-from (= 1)\n",
        );
        assert_eq!(c.name, "coreutils");
        assert!(c.essential);
        assert_eq!(
            c.depends,
            vec![
                vec!["libacl1".to_string()],
                vec!["libc6".to_string()],
                vec!["libgmp10".to_string(), "libgmp-alt".to_string()],
                vec!["foo".to_string()]
            ]
        );
        assert_eq!(c.provides, vec!["coreutils-from".to_string()]);
    }

    #[test]
    fn the_closure_follows_dependencies_among_the_packages_fetched() {
        let pkg = |name: &str, essential: bool, deps: &[&[&str]], provides: &[&str]| Control {
            name: name.into(),
            essential,
            depends: deps.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect(),
            provides: provides.iter().map(|s| s.to_string()).collect(),
        };
        let all = vec![
            pkg("bash", true, &[&["libc6"], &["debianutils"]], &[]),
            pkg("libc6", false, &[&["libgcc-s1"]], &[]),
            pkg("libgcc-s1", false, &[], &[]),
            pkg("debianutils", false, &[&["awk"]], &[]),
            pkg("mawk", false, &[], &["awk"]),
            pkg("postgresql", false, &[&["libc6"]], &[]),
            pkg("apt", false, &[], &[]),
        ];
        let set: Vec<String> = closure(&all).into_iter().collect();
        assert_eq!(set, ["bash", "debianutils", "libc6", "libgcc-s1", "mawk"]);
    }
}
