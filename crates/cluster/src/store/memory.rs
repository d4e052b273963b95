//! The store in memory, for tests of the control plane without etcd: a
//! sorted map of keys with etcd's revisions (one counter for the whole
//! store, moved on by each write that changes something; each key keeps
//! the revision of its last write), every write under one lock, so a
//! conditional write is a compare-and-swap with etcd's meaning.

use super::{Entry, Store, StoreError};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A [`Store`] in a map.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The revision of the last write (0: none yet).
    revision: i64,
    /// Each key's value and the revision that last wrote it.
    entries: BTreeMap<String, (Vec<u8>, i64)>,
}

impl State {
    fn write(&mut self, key: &str, value: &[u8]) {
        self.revision += 1;
        self.entries.insert(key.into(), (value.to_vec(), self.revision));
    }

    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = Entry> + 'a {
        self.entries
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(key, (value, revision))| Entry { key: key.clone(), value: value.clone(), revision: *revision })
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A test that panicked while holding it left the map whole: every
        // write is made entire under the lock.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.state().entries.get(key).map(|(value, revision)| Entry {
            key: key.into(),
            value: value.clone(),
            revision: *revision,
        }))
    }

    fn range(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        Ok(self.state().under(prefix).collect())
    }

    fn range_since(&self, prefix: &str, after: i64) -> Result<Vec<Entry>, StoreError> {
        let mut entries: Vec<Entry> = self.state().under(prefix).filter(|e| e.revision > after).collect();
        entries.sort_by_key(|e| e.revision);
        Ok(entries)
    }

    fn keys(&self, prefix: &str) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(self.state().under(prefix).map(|e| (e.key, e.revision)).collect())
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<bool, StoreError> {
        let mut state = self.state();
        if state.entries.contains_key(key) {
            return Ok(false);
        }
        state.write(key, value);
        Ok(true)
    }

    fn replace(&self, key: &str, value: &[u8], revision: i64) -> Result<bool, StoreError> {
        let mut state = self.state();
        // etcd's mod_revision of a key that is not there is 0.
        let now = state.entries.get(key).map_or(0, |(_, r)| *r);
        if now != revision {
            return Ok(false);
        }
        state.write(key, value);
        Ok(true)
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.state().write(key, value);
        Ok(())
    }

    fn remove(&self, key: &str) -> Result<bool, StoreError> {
        let mut state = self.state();
        if state.entries.remove(key).is_none() {
            return Ok(false);
        }
        state.revision += 1;
        Ok(true)
    }

    fn remove_all(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut state = self.state();
        let before = state.entries.len();
        for k in keys {
            state.entries.remove(k);
        }
        // One transaction: one revision, if it deleted anything.
        if state.entries.len() != before {
            state.revision += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_compare_revisions_as_etcd_does() {
        let s = MemoryStore::new();
        assert!(s.create("/a/1", b"x").unwrap());
        // Only if absent.
        assert!(!s.create("/a/1", b"y").unwrap());
        let read = s.get("/a/1").unwrap().unwrap();
        assert_eq!((read.value.as_slice(), read.revision), (b"x".as_slice(), 1));
        s.put("/b", b"z").unwrap();
        // Written since it was read (by anyone, at any key's write
        // revision): refused; as read: written.
        assert!(s.replace("/a/1", b"w", read.revision).unwrap());
        assert!(!s.replace("/a/1", b"v", read.revision).unwrap());
        assert_eq!(s.get("/a/1").unwrap().unwrap().value, b"w");
        // A key that is not there compares as revision 0.
        assert!(!s.replace("/a/2", b"v", 5).unwrap());
        assert!(s.replace("/a/2", b"v", 0).unwrap());
        assert!(s.remove("/a/2").unwrap());
        assert!(!s.remove("/a/2").unwrap());
    }

    #[test]
    fn ranges_are_by_prefix_by_key_and_since_a_revision_by_write() {
        let s = MemoryStore::new();
        for k in ["/e/c", "/e/a", "/f", "/e/b"] {
            s.put(k, k.as_bytes()).unwrap();
        }
        let keys = |es: Vec<Entry>| es.into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(keys(s.range("/e/").unwrap()), ["/e/a", "/e/b", "/e/c"]);
        // Written after revision 1 (the first put), oldest first.
        assert_eq!(keys(s.range_since("/e/", 1).unwrap()), ["/e/a", "/e/b"]);
        s.put("/e/c", b"again").unwrap();
        assert_eq!(keys(s.range_since("/e/", 4).unwrap()), ["/e/c"]);
        s.remove_all(&["/e/a".into(), "/e/b".into()]).unwrap();
        assert_eq!(s.keys("/e/").unwrap(), [("/e/c".to_string(), 5)]);
    }
}
