//! The prefix store: prompt prefixes kept on the device after their slot has gone to another
//! request, so that more conversations (or system prompts) stay cached than the server has
//! slots, as llama-server's `--cache-ram` and vLLM's automatic prefix caching do. Entries are
//! [`SlotSnapshot`]s keyed by their tokens and adapters; the least recently used go first when
//! the store passes its memory limit (`serve --cache-memory`).
//!
//! An entry covers every prefix of its tokens for attention-only models (a slot loaded from
//! it is cut back to what a prompt shares); with recurrent layers (Qwen3.5) it can only resume
//! at its end, so it serves prompts that extend it whole.
use std::sync::Arc;

use burn_gguf_models::SlotSnapshot;

/// What the store needs of a saved state (a [`SlotSnapshot`], or a test's stand-in).
pub(super) trait Saved {
    /// Positions held.
    fn len(&self) -> usize;
    /// Memory held, in bytes.
    fn bytes(&self) -> usize;
    /// Whether it resumes only at its end.
    fn whole_only(&self) -> bool;
}

impl Saved for SlotSnapshot {
    fn len(&self) -> usize {
        SlotSnapshot::len(self)
    }
    fn bytes(&self) -> usize {
        SlotSnapshot::bytes(self)
    }
    fn whole_only(&self) -> bool {
        self.is_recurrent()
    }
}

/// One stored prefix.
struct Entry<S, L> {
    /// The tokens whose state `saved` holds (`saved.len()` of them).
    tokens: Vec<u32>,
    /// The adapters the state was computed with (compared by identity).
    lora: Option<Arc<L>>,
    saved: S,
    /// The store's clock when it was last stored or used.
    last_used: u64,
}

/// Stored prefixes under a memory limit, least recently used evicted first (see the module
/// docs). `L` is the adapters' type ([`burn_gguf_models::DecoderLora`] in the server).
pub(super) struct PrefixStore<S, L> {
    entries: Vec<Entry<S, L>>,
    /// Bytes the entries may hold together (0: the store keeps nothing).
    limit: usize,
    bytes: usize,
    clock: u64,
}

/// What [`PrefixStore::insert`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Inserted {
    /// Whether the store holds the state now: added, or covered by an entry it had.
    pub stored: bool,
    /// Whether it was added as a new entry.
    pub added: bool,
    /// Older entries evicted for room (least recently used first).
    pub evicted: usize,
    /// Older entries dropped because the new one covers them (their tokens are its prefix).
    pub replaced: usize,
}

impl<S: Saved, L> PrefixStore<S, L> {
    /// An empty store of at most `limit` bytes (0: off).
    pub fn new(limit: usize) -> Self {
        Self {
            entries: Vec::new(),
            limit,
            bytes: 0,
            clock: 0,
        }
    }

    /// Whether the store keeps anything.
    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// Bytes its entries hold.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps `saved`, the state of `tokens[..saved.len()]` computed with `lora`, unless an
    /// entry already covers it (same adapters, those tokens its prefix, and usable for them);
    /// drops the entries it covers, then evicts the least recently used past the limit. An
    /// entry larger than the whole limit is not kept.
    pub fn insert(&mut self, tokens: &[u32], lora: Option<Arc<L>>, saved: S) -> Inserted {
        let len = saved.len();
        let mut done = Inserted::default();
        if !self.enabled() || len == 0 || len > tokens.len() || saved.bytes() > self.limit {
            return done;
        }
        let tokens = &tokens[..len];
        self.clock += 1;
        if let Some(e) = (self.entries.iter_mut())
            .find(|e| same(&e.lora, &lora) && serves(&e.tokens, e.saved.whole_only(), tokens))
        {
            e.last_used = self.clock;
            done.stored = true;
            return done;
        }
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|e| {
            let drop = same(&e.lora, &lora) && serves(tokens, saved.whole_only(), &e.tokens);
            if drop {
                freed += e.saved.bytes();
            }
            !drop
        });
        self.bytes -= freed;
        done.replaced = before - self.entries.len();
        self.bytes += saved.bytes();
        self.entries.push(Entry {
            tokens: tokens.to_vec(),
            lora,
            saved,
            last_used: self.clock,
        });
        (done.stored, done.added) = (true, true);
        while self.bytes > self.limit {
            let oldest = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last_used)
                .expect("over the limit means an entry");
            let e = self.entries.swap_remove(oldest);
            self.bytes -= e.saved.bytes();
            done.evicted += 1;
        }
        done
    }

    /// The entry sharing the longest prefix with `prompt` (at most `usable` tokens), computed
    /// with the same adapters, and that prefix's length: only an entry whose state resumes
    /// there (any entry of an attention-only model; a recurrent one only at its end).
    pub fn lookup(
        &self,
        prompt: &[u32],
        lora: &Option<Arc<L>>,
        usable: usize,
    ) -> Option<(usize, usize)> {
        (self.entries.iter().enumerate())
            .filter(|(_, e)| same(&e.lora, lora))
            .filter_map(|(i, e)| {
                let common = common_prefix(&e.tokens, prompt).min(usable);
                let whole = e.saved.whole_only();
                let usable_here = if whole {
                    common == e.tokens.len()
                } else {
                    common > 0
                };
                usable_here.then_some((i, common))
            })
            .max_by_key(|&(i, common)| (common, self.entries[i].last_used))
    }

    /// Entry `i`'s tokens and state, marked as used now.
    fn get(&mut self, i: usize) -> (&[u32], &S) {
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        (&e.tokens, &e.saved)
    }

    /// A copy of the entry [`PrefixStore::lookup`] finds when it shares more than `longer_than`
    /// tokens with `prompt`: its tokens and state (cheap: tensors are shared handles), marked
    /// as used. A copy, so that storing another entry (which may evict this one) does not
    /// change what the caller loads.
    pub fn fetch(
        &mut self,
        prompt: &[u32],
        lora: &Option<Arc<L>>,
        usable: usize,
        longer_than: usize,
    ) -> Option<(Vec<u32>, S)>
    where
        S: Clone,
    {
        let (i, _) = self
            .lookup(prompt, lora, usable)
            .filter(|&(_, common)| common > longer_than)?;
        let (tokens, saved) = self.get(i);
        Some((tokens.to_vec(), saved.clone()))
    }
}

/// Whether a state of `tokens` (resuming only at its end when `whole`) serves a prompt of
/// `prefix`: the tokens start with it, and end with it too for a `whole` state.
fn serves(tokens: &[u32], whole: bool, prefix: &[u32]) -> bool {
    tokens.starts_with(prefix) && (!whole || tokens.len() == prefix.len())
}

/// Same adapters: both none, or the same merged adapters.
fn same<L>(a: &Option<Arc<L>>, b: &Option<Arc<L>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub(super) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in state: `len` positions of 10 bytes each.
    #[derive(Clone)]
    struct Fake {
        len: usize,
        whole: bool,
    }

    impl Saved for Fake {
        fn len(&self) -> usize {
            self.len
        }
        fn bytes(&self) -> usize {
            10 * self.len
        }
        fn whole_only(&self) -> bool {
            self.whole
        }
    }

    fn fake(len: usize) -> Fake {
        Fake { len, whole: false }
    }

    #[test]
    fn longest_prefix_wins_and_prefixes_are_cut_to_the_prompt() {
        let mut store = PrefixStore::<Fake, ()>::new(1000);
        assert!(store.insert(&[1, 2, 3, 4], None, fake(4)).added);
        assert!(store.insert(&[1, 2, 9, 9, 9], None, fake(5)).added);
        assert_eq!(store.lookup(&[1, 2, 3, 4, 5], &None, 4), Some((0, 4)));
        // The prompt's last token is not usable: 3 of 4.
        assert_eq!(store.lookup(&[1, 2, 3, 4], &None, 3), Some((0, 3)));
        assert_eq!(store.lookup(&[1, 2, 9, 7], &None, 3), Some((1, 3)));
        assert_eq!(store.lookup(&[5, 6], &None, 1), None);
        // Another adapter's cache is not this prompt's prefix.
        let lora = Some(Arc::new(()));
        assert_eq!(store.lookup(&[1, 2, 3, 4, 5], &lora, 4), None);
    }

    #[test]
    fn least_recently_used_go_first_past_the_limit() {
        let mut store = PrefixStore::<Fake, ()>::new(100);
        store.insert(&[1; 4], None, fake(4)); // 40 bytes
        store.insert(&[2; 4], None, fake(4)); // 80
        // Using the first makes the second the least recent.
        let (tokens, _) = store.fetch(&[1; 5], &None, 4, 0).unwrap();
        assert_eq!(tokens, [1; 4]);
        // Not longer than what the caller has: not fetched (nor marked used).
        assert!(store.fetch(&[2; 5], &None, 4, 4).is_none());
        let done = store.insert(&[3; 4], None, fake(4)); // 120 > 100: one goes
        assert_eq!((done.added, done.evicted), (true, 1));
        assert_eq!(store.bytes(), 80);
        assert!(store.lookup(&[2; 5], &None, 4).is_none());
        assert!(store.lookup(&[1; 5], &None, 4).is_some());
        // Larger than the whole limit: not kept, nothing evicted.
        let done = store.insert(&[4; 11], None, fake(11));
        assert_eq!(done, Inserted::default());
        assert_eq!((store.len(), store.bytes()), (2, 80));
        // Off: nothing kept.
        let mut off = PrefixStore::<Fake, ()>::new(0);
        assert!(!off.insert(&[1; 4], None, fake(4)).added);
    }

    #[test]
    fn covered_entries_are_not_stored_twice() {
        let mut store = PrefixStore::<Fake, ()>::new(1000);
        store.insert(&[1, 2], None, fake(2));
        // A longer state of the same tokens replaces the shorter.
        let done = store.insert(&[1, 2, 3], None, fake(3));
        assert_eq!((done.added, done.replaced), (true, 1));
        assert_eq!((store.len(), store.bytes()), (1, 30));
        // A prefix of a stored entry is already covered.
        let done = store.insert(&[1, 2], None, fake(2));
        assert_eq!((done.stored, done.added), (true, false));
        // Only the first `len` tokens are the entry's.
        assert!(store.insert(&[7, 8, 9], None, fake(1)).added);
        assert_eq!(store.lookup(&[7, 8, 9], &None, 2), Some((1, 1)));
    }

    #[test]
    fn recurrent_entries_resume_only_at_their_end() {
        let mut store = PrefixStore::<Fake, ()>::new(1000);
        store.insert(
            &[1, 2, 3],
            None,
            Fake {
                len: 3,
                whole: true,
            },
        );
        assert_eq!(store.lookup(&[1, 2, 3, 4], &None, 3), Some((0, 3)));
        assert_eq!(store.lookup(&[1, 2, 5, 4], &None, 3), None);
        assert_eq!(store.lookup(&[1, 2, 3], &None, 2), None);
        // A shorter recurrent state is not covered by a longer one (it resumes elsewhere).
        assert!(
            store
                .insert(
                    &[1, 2],
                    None,
                    Fake {
                        len: 2,
                        whole: true
                    }
                )
                .added
        );
        assert_eq!(store.len(), 2);
    }
}
