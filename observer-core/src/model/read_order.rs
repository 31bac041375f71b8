//! A map for tables refilled from the kernel's flow map every interval:
//! entries stay in the order their keys were first added, and each
//! lookup first tries the entry after the one the previous lookup found.
//!
//! Why: the kernel's batch read returns a hash map's keys in its bucket
//! order, the same from read to read, and the stages after it keep that
//! order, so a pass's next key is almost always the next entry. Found
//! there, it costs one compare, in memory walked in order; a hash map
//! would cost a hash and a random cache miss per key (at 100,000 peers,
//! the largest userspace cost of an interval). Any other order is still
//! correct, through the index.

use std::hash::{BuildHasher, Hash};

use hashbrown::{HashTable, hash_table::Entry};

/// Entries in first-added order, with an index by key.
#[derive(Debug)]
pub struct ReadOrderMap<K, V> {
    entries: Vec<(K, V)>,
    /// Each key's position in `entries` (hashed through the entries, so no
    /// key is stored twice).
    index: HashTable<usize>,
    hasher: foldhash::fast::RandomState,
    /// Where the next lookup looks first.
    next: usize,
}

impl<K, V> Default for ReadOrderMap<K, V> {
    fn default() -> Self {
        ReadOrderMap {
            entries: Vec::new(),
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            next: 0,
        }
    }
}

impl<K: Eq + Hash, V> ReadOrderMap<K, V> {
    /// Starts a pass in read order: the next lookup looks first at the
    /// first entry.
    pub fn rewind(&mut self) {
        self.next = 0;
    }

    /// The value of `key`, made by `make` (and put last) when it is new.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let at = if self.at_hint(&key) {
            self.next
        } else {
            let ReadOrderMap {
                entries,
                index,
                hasher,
                ..
            } = self;
            let entry = index.entry(
                hasher.hash_one(&key),
                |&at| entries[at].0 == key,
                |&at| hasher.hash_one(&entries[at].0),
            );
            match entry {
                Entry::Occupied(found) => *found.get(),
                Entry::Vacant(free) => {
                    free.insert(entries.len());
                    entries.push((key, make()));
                    entries.len() - 1
                }
            }
        };
        self.next = at + 1;
        &mut self.entries[at].1
    }

    /// Makes room for `additional` more entries, doubling as a `Vec`
    /// does but to at most `most` entries in all: a table with a cap
    /// would otherwise keep the room its last doubling added beyond it.
    pub fn reserve_capped(&mut self, additional: usize, most: usize) {
        let needed = self.entries.len() + additional;
        if needed > self.entries.capacity() {
            let grown = (self.entries.capacity() * 2).clamp(needed, most.max(needed));
            self.entries.reserve_exact(grown - self.entries.len());
        }
    }

    /// The value of `key`, if it has one.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.position(key).map(|at| &self.entries[at].1)
    }

    /// The value of `key`, mutable, if it has one; the next lookup looks
    /// first after it.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let at = self.position(key)?;
        self.next = at + 1;
        Some(&mut self.entries[at].1)
    }

    /// Whether `key`'s entry is the one the next lookup looks at first.
    fn at_hint(&self, key: &K) -> bool {
        self.entries.get(self.next).is_some_and(|(k, _)| k == key)
    }

    /// Where `key`'s entry is: the hinted one, or through the index.
    fn position(&self, key: &K) -> Option<usize> {
        if self.at_hint(key) {
            return Some(self.next);
        }
        self.index
            .find(self.hasher.hash_one(key), |&at| self.entries[at].0 == *key)
            .copied()
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entries, in order, values mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    /// Keeps the entries `keep` says yes to, in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let before = self.entries.len();
        self.entries.retain_mut(|(k, v)| keep(k, v));
        if self.entries.len() == before {
            return;
        }
        // Positions moved: index again (rare: keys leave only when the
        // rows are bounded or gone).
        let ReadOrderMap {
            entries,
            index,
            hasher,
            ..
        } = self;
        index.clear();
        for (at, (key, _)) in entries.iter().enumerate() {
            index.insert_unique(hasher.hash_one(key), at, |&other| {
                hasher.hash_one(&entries[other].0)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes in the same order, in another order, with keys added and
    /// removed between them: each key keeps its own value.
    #[test]
    fn each_key_keeps_its_value_whatever_the_order() {
        let mut map: ReadOrderMap<u32, u32> = ReadOrderMap::default();
        let pass = |map: &mut ReadOrderMap<u32, u32>, keys: &[u32]| {
            map.rewind();
            for &k in keys {
                *map.get_or_insert_with(k, || 0) += k;
            }
        };
        pass(&mut map, &[1, 2, 3]);
        pass(&mut map, &[1, 2, 3]);
        pass(&mut map, &[3, 9, 1]);
        map.retain(|k, _| *k != 2);
        pass(&mut map, &[1, 3, 9, 4]);
        let entries: Vec<(u32, u32)> = map.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(entries, [(1, 4), (3, 12), (9, 18), (4, 4)]);
        assert_eq!(map.len(), 4);
        // Lookups without inserting: at the hint, away from it, missing.
        map.rewind();
        assert_eq!(map.get_mut(&1).map(|v| *v), Some(4));
        assert_eq!(map.get(&3), Some(&12));
        assert_eq!(map.get_mut(&4).map(|v| *v), Some(4));
        assert_eq!(map.get(&2), None);
        assert!(map.get_mut(&2).is_none());
    }

    /// Room grows by doubling, but never past the cap (unless asked for
    /// more than it).
    #[test]
    fn room_stops_at_the_cap() {
        let mut map: ReadOrderMap<u32, ()> = ReadOrderMap::default();
        map.reserve_capped(600, 1000);
        assert!(map.entries.capacity() >= 600);
        for k in 0..600 {
            map.get_or_insert_with(k, || ());
        }
        map.reserve_capped(100, 1000);
        assert_eq!(map.entries.capacity(), 1000);
        map.reserve_capped(1500, 1000);
        assert!(map.entries.capacity() >= 2100);
    }
}
