//! Kernel module dependency resolution from depmod's output
//! (`modules.dep`, `modules.softdep`, `modules.alias`, `modules.builtin`).
//!
//! Debian's kernel package ships no `modules.dep` (its postinst runs depmod),
//! so the build runs the host's `depmod -b` on the extracted tree first.

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Canonical module name of a path like `kernel/fs/ext4/ext4.ko.xz`
/// (basename without `.ko*`, `-` replaced by `_`).
pub fn module_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or(path);
    let stem = match base.find(".ko") {
        Some(i) => &base[..i],
        None => base,
    };
    stem.replace('-', "_")
}

/// A module asked for that is neither loadable nor built into the kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("module {name} is neither in modules.dep nor built in")]
pub struct MissingModule {
    /// With `-` spelled `_`, as modules.dep does.
    pub name: String,
}

/// The parsed depmod database.
#[derive(Debug, Default, Clone)]
pub struct ModuleDb {
    /// name -> (relative path, hard dependencies as names)
    pub modules: BTreeMap<String, (String, Vec<String>)>,
    /// name -> names/aliases to load before it (`softdep X pre: ...`)
    pub softdep_pre: BTreeMap<String, Vec<String>>,
    /// alias -> module names
    pub aliases: BTreeMap<String, Vec<String>>,
    /// names of built-in modules
    pub builtin: BTreeSet<String>,
}

impl ModuleDb {
    /// Parse the text of `modules.dep`, `modules.softdep`, `modules.alias`
    /// and `modules.builtin` (the last three may be empty).
    pub fn parse(dep: &str, softdep: &str, alias: &str, builtin: &str) -> ModuleDb {
        let mut db = ModuleDb::default();
        for line in dep.lines() {
            let Some((path, deps)) = line.split_once(':') else {
                continue;
            };
            let path = path.trim();
            if path.is_empty() {
                continue;
            }
            let deps = deps.split_whitespace().map(module_name).collect();
            db.modules.insert(module_name(path), (path.to_string(), deps));
        }
        for line in softdep.lines() {
            let mut w = line.split_whitespace();
            if w.next() != Some("softdep") {
                continue;
            }
            let Some(name) = w.next() else { continue };
            let mut in_pre = false;
            for word in w {
                match word {
                    "pre:" => in_pre = true,
                    "post:" => in_pre = false,
                    _ if in_pre => db.softdep_pre.entry(name.replace('-', "_")).or_default().push(word.to_string()),
                    _ => {}
                }
            }
        }
        for line in alias.lines() {
            let mut w = line.split_whitespace();
            if let (Some("alias"), Some(a), Some(m)) = (w.next(), w.next(), w.next()) {
                db.aliases.entry(a.to_string()).or_default().push(m.replace('-', "_"));
            }
        }
        for line in builtin.lines() {
            let line = line.trim();
            if !line.is_empty() {
                db.builtin.insert(module_name(line));
            }
        }
        db
    }

    /// Module names a softdep entry (module name or alias) stands for.
    fn lookup(&self, name_or_alias: &str) -> Vec<String> {
        let n = name_or_alias.replace('-', "_");
        if self.modules.contains_key(&n) || self.builtin.contains(&n) {
            return vec![n];
        }
        self.aliases.get(name_or_alias).cloned().unwrap_or_default()
    }

    /// Load order (dependencies first) of the loadable modules needed for
    /// `wanted`: hard dependencies from modules.dep plus `pre:` soft
    /// dependencies (through aliases). Built-in modules are skipped. A wanted
    /// module that is neither loadable nor built in is an error.
    pub fn resolve(&self, wanted: &[&str]) -> Result<Vec<(String, String)>, MissingModule> {
        let mut order = Vec::new();
        let mut done = HashSet::new();
        for w in wanted {
            let name = w.replace('-', "_");
            if self.builtin.contains(&name) {
                continue;
            }
            if !self.modules.contains_key(&name) {
                return Err(MissingModule { name });
            }
            self.visit(&name, &mut done, &mut Vec::new(), &mut order);
        }
        Ok(order)
    }

    fn visit(
        &self,
        name: &str,
        done: &mut HashSet<String>,
        stack: &mut Vec<String>,
        order: &mut Vec<(String, String)>,
    ) {
        if done.contains(name) || stack.iter().any(|s| s == name) || self.builtin.contains(name) {
            return;
        }
        let Some((path, deps)) = self.modules.get(name) else {
            return;
        };
        stack.push(name.to_string());
        for soft in self.softdep_pre.get(name).into_iter().flatten() {
            for target in self.lookup(soft) {
                self.visit(&target, done, stack, order);
            }
        }
        // modules.dep lists the transitive closure; visiting each keeps the
        // order right even if a file lists only direct dependencies.
        for dep in deps.iter().rev() {
            self.visit(dep, done, stack, order);
        }
        stack.pop();
        done.insert(name.to_string());
        order.push((name.to_string(), path.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/fs/mbcache.ko.xz:
kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz kernel/fs/jbd2/jbd2.ko.xz
kernel/fs/jbd2/jbd2.ko.xz:
kernel/crypto/crc32c_generic.ko.xz:
kernel/lib/crc16.ko.xz:
kernel/drivers/virtio/virtio_mmio.ko.xz:
kernel/drivers/block/virtio_blk.ko.xz:
kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz kernel/net/core/failover.ko.xz
kernel/drivers/net/net_failover.ko.xz: kernel/net/core/failover.ko.xz
kernel/net/core/failover.ko.xz:
kernel/fs/xfs/xfs.ko.xz: kernel/lib/libcrc32c.ko.xz
kernel/lib/libcrc32c.ko.xz:
kernel/drivers/hid/hid-generic.ko.xz:
";
    const SOFTDEP: &str = "\
# Soft dependencies extracted from modules themselves.
softdep ext4 pre: crypto-crc32c
softdep jbd2 pre: crypto-crc32c
softdep libcrc32c pre: crc32c post: xfs
";
    const ALIAS: &str = "\
# Aliases extracted from modules themselves.
alias crypto-crc32c crc32c_generic
alias crc32c crc32c_generic
alias virtio:d00000002v* virtio_blk
";

    fn pos(order: &[(String, String)], name: &str) -> usize {
        order.iter().position(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing from {order:?}"))
    }

    #[test]
    fn names() {
        assert_eq!(module_name("kernel/fs/ext4/ext4.ko.xz"), "ext4");
        assert_eq!(module_name("kernel/drivers/hid/hid-generic.ko"), "hid_generic");
        assert_eq!(module_name("crc16.ko.zst"), "crc16");
    }

    #[test]
    fn resolves_root_modules_in_load_order() {
        let db = ModuleDb::parse(DEP, SOFTDEP, ALIAS, "");
        let order = db.resolve(&["virtio_mmio", "virtio_blk", "virtio_net", "ext4"]).unwrap();
        let names: Vec<_> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 10, "{names:?}");
        assert!(pos(&order, "failover") < pos(&order, "net_failover"));
        assert!(pos(&order, "net_failover") < pos(&order, "virtio_net"));
        for dep in ["crc16", "mbcache", "jbd2", "crc32c_generic"] {
            assert!(pos(&order, dep) < pos(&order, "ext4"), "{dep} after ext4: {names:?}");
        }
        assert!(pos(&order, "crc32c_generic") < pos(&order, "jbd2"));
        assert_eq!(order[pos(&order, "ext4")].1, "kernel/fs/ext4/ext4.ko.xz");
        assert!(!names.contains(&"xfs") && !names.contains(&"libcrc32c"));
    }

    #[test]
    fn softdep_post_ignored_and_builtin_skipped() {
        let db = ModuleDb::parse(DEP, SOFTDEP, ALIAS, "kernel/lib/crc16.ko\nkernel/drivers/virtio/virtio_mmio.ko\n");
        let order = db.resolve(&["virtio_mmio", "libcrc32c"]).unwrap();
        let names: Vec<_> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["crc32c_generic", "libcrc32c"]);
        let db2 =
            ModuleDb::parse(DEP.replace("kernel/lib/crc16.ko.xz:\n", "").as_str(), "", "", "kernel/lib/crc16.ko\n");
        let names: Vec<_> = db2.resolve(&["ext4"]).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["jbd2", "mbcache", "ext4"]);
    }

    #[test]
    fn missing_module_is_an_error() {
        let db = ModuleDb::parse(DEP, "", "", "");
        let err = db.resolve(&["9p"]).unwrap_err();
        assert_eq!(err.name, "9p");
        assert!(err.to_string().contains("9p"));
        // hyphen/underscore equivalence
        assert_eq!(db.resolve(&["hid-generic"]).unwrap()[0].0, "hid_generic");
    }
}
