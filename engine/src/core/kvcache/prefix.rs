//! What the prefix caches share: the [`PrefixCache`] interface both implement,
//! their node handles and matches, and a request's page table ([`ReqPages`]).
//!
//! Kept apart from `mod.rs` (which re-exports it and builds the caches) so that
//! `radix.rs` and `naive.rs` do not import the module that imports them. The
//! fields the caches manipulate are `pub(super)`: visible to the cache
//! implementations beside this file, private outside `kvcache`.

use std::fmt;

use super::pool::{Page, PageId};

/// A node of a prefix cache. Node 0 is the root (the empty prefix), which
/// `NaiveCache` uses for every handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub(super) usize);

impl NodeId {
    pub const ROOT: NodeId = NodeId(0);
}

/// A locked path of the prefix cache: its pages stay resident until the
/// handle is given back to [`PrefixCache::unlock`]. Not `Clone`, so a lock is
/// released exactly once.
#[derive(Debug, PartialEq, Eq)]
pub struct CacheHandle {
    pub(super) node: NodeId,
    pub(super) num_pages: usize,
}

impl CacheHandle {
    pub(super) fn root() -> Self {
        Self { node: NodeId::ROOT, num_pages: 0 }
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }
}

/// The result of looking a token sequence up, before anything is locked.
#[derive(Debug)]
pub struct PrefixMatch {
    pub(super) node: NodeId,
    pub(super) pages: Vec<PageId>,
    /// How many of `pages` are evictable right now, i.e. how much available
    /// memory locking this match would take away. Lets admission decide
    /// without a lock/unlock round trip.
    pub(super) num_evictable_pages: usize,
}

impl PrefixMatch {
    /// Number of matched pages (the match is whole pages).
    pub fn num_pages(&self) -> usize {
        self.pages.len()
    }

    pub fn num_evictable_pages(&self) -> usize {
        self.num_evictable_pages
    }
}

/// The page table of one running request: a prefix borrowed from the prefix
/// cache (locked by `handle`), followed by pages the request owns.
///
/// Token `p` of the request lives in page `page_ids()[p / page_size]`.
/// Only [`CacheManager`] creates, grows and releases it; dropping one without
/// [`CacheManager::release`] leaks its pages (and `check_integrity` notices).
#[derive(Debug)]
#[must_use = "request pages must be released through CacheManager::release"]
pub struct ReqPages {
    pub(super) handle: CacheHandle,
    /// Invariant: `shared.len() == handle.num_pages`.
    pub(super) shared: Vec<PageId>,
    pub(super) owned: Vec<Page>,
}

impl ReqPages {
    pub fn num_pages(&self) -> usize {
        self.shared.len() + self.owned.len()
    }

    /// Number of pages at the front that belong to the prefix cache.
    pub fn num_shared_pages(&self) -> usize {
        self.shared.len()
    }

    /// The page table, in token order.
    pub fn page_ids(&self) -> impl Iterator<Item = PageId> + '_ {
        self.shared.iter().copied().chain(self.owned.iter().map(Page::id))
    }

    pub fn page_id(&self, idx: usize) -> PageId {
        match idx.checked_sub(self.shared.len()) {
            None => self.shared[idx],
            Some(owned_idx) => self.owned[owned_idx].id(),
        }
    }
}

/// What a prefix cache must provide. Implementations are pure bookkeeping:
/// they own pages but never touch KV memory.
pub trait PrefixCache: fmt::Debug + Send {
    /// Longest cached prefix of `tokens`, in whole pages. May restructure the
    /// cache (split a node so that the match ends on a node boundary) and
    /// refreshes the LRU time of the matched path, but locks nothing.
    fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch;

    /// Protects the path from the root to `node` from eviction.
    fn lock(&mut self, node: NodeId);

    /// Undoes one [`Self::lock`] of `node`.
    fn unlock(&mut self, node: NodeId);

    /// Offers the first `tokens.len() / page_size` pages of `pages` (whose
    /// KV holds `tokens`; `tokens.len()` is a multiple of the page size) to
    /// the cache. The cache takes ownership of the pages it did not have,
    /// rewrites `pages` to borrow them (with a handle locking the new path,
    /// the old one unlocked), and returns the request's pages that duplicate
    /// already-cached ones, for the caller to free.
    fn insert(&mut self, tokens: &[u32], pages: &mut ReqPages) -> Vec<Page>;

    /// Removes unlocked pages, least recently used leaves first, until at
    /// least `num_pages` are returned (whole nodes, so possibly more).
    /// Asserts that `num_pages <= num_evictable_pages()`.
    fn evict(&mut self, num_pages: usize) -> Vec<Page>;

    /// Pages owned by the cache.
    fn num_cached_pages(&self) -> usize;

    /// Pages owned by the cache and not locked by any request.
    fn num_evictable_pages(&self) -> usize;

    /// Recomputes the bookkeeping from scratch and asserts it matches.
    fn check_integrity(&self);
}
