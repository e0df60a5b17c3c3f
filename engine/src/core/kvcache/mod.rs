//! KV cache management: the page pool, the per-request page tables and the
//! prefix caches that let requests share the KV of a common prompt prefix.
//!
//! | file | what |
//! | --- | --- |
//! | `pool.rs` | [`PagePool`]: the free list of KV pages; [`Page`] is an owned, non-`Clone` handle |
//! | `radix.rs` | [`RadixCache`]: radix tree over token ids at page granularity, LRU eviction |
//! | `naive.rs` | [`NaiveCache`]: no reuse, every request computes its whole prompt |
//! | `prefix.rs` | [`PrefixCache`] (the interface both caches implement), its handles, and [`ReqPages`] |
//! | `mod.rs` | [`CacheKind`] and [`CacheManager`] (the pool plus one prefix cache) |
//!
//! Every page of the pool is, at any time, in exactly one of three places:
//! free in the pool, owned by one request ([`ReqPages`]'s private tail), or
//! owned by the prefix cache (a radix node). Pages of the prefix cache that
//! running requests use are *locked* (reference counted) and never evicted;
//! unlocked ones are *evictable* and count as available memory, because the
//! cache gives them back on demand in LRU order.
//! [`CacheManager::check_integrity`] verifies that the three add up.
//!
//! This follows mini-sglang's `kvcache/` and `scheduler/cache.py`, with two
//! differences: a request's page table is a Rust value rather than a row of a
//! device tensor (the block table is built per step), and when a running
//! request inserts its prefix and finds part of it already cached, its
//! duplicate pages are swapped for the cached ones in its page table before
//! being freed.

mod naive;
mod pool;
mod prefix;
mod radix;

pub use naive::NaiveCache;
pub use pool::{pages_for, Page, PageId, PagePool};
pub use prefix::{CacheHandle, NodeId, PrefixCache, PrefixMatch, ReqPages};
pub use radix::RadixCache;

use std::fmt;

/// Which prefix cache to use (`--cache radix|naive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheKind {
    /// Radix tree over token ids: requests sharing a prefix share its pages.
    Radix,
    /// No reuse: pages are freed as soon as their request finishes.
    Naive,
}

impl fmt::Display for CacheKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheKind::Radix => "radix",
            CacheKind::Naive => "naive",
        })
    }
}

/// The page pool plus a prefix cache: everything the scheduler needs to give
/// requests KV memory.
#[derive(Debug)]
pub struct CacheManager {
    pool: PagePool,
    prefix: Box<dyn PrefixCache>,
    /// Pages owned by requests (the `owned` tails of live [`ReqPages`]).
    num_req_pages: usize,
    /// Prompt tokens served from the prefix cache, summed over admissions.
    hit_tokens: u64,
    /// Overlap scheduling: pages freed while steps that may read them are in
    /// flight, with the last such step; they go back to the pool once it is
    /// resolved.
    held: Vec<(u64, Vec<Page>)>,
    /// The last launched step, and the last resolved one.
    launched_step: u64,
    resolved_step: u64,
}

impl CacheManager {
    pub fn new(page_size: usize, num_pages: usize, kind: CacheKind) -> Self {
        let prefix: Box<dyn PrefixCache> = match kind {
            CacheKind::Radix => Box::new(RadixCache::new(page_size)),
            CacheKind::Naive => Box::new(NaiveCache::new()),
        };
        Self {
            pool: PagePool::new(page_size, num_pages),
            prefix,
            num_req_pages: 0,
            hit_tokens: 0,
            held: Vec::new(),
            launched_step: 0,
            resolved_step: 0,
        }
    }

    pub fn page_size(&self) -> usize {
        self.pool.page_size()
    }

    pub fn num_pages(&self) -> usize {
        self.pool.num_pages()
    }

    pub fn num_free_pages(&self) -> usize {
        self.pool.num_free()
    }

    /// Pages that can be handed out now: free ones plus evictable cached ones.
    pub fn num_available_pages(&self) -> usize {
        self.pool.num_free() + self.prefix.num_evictable_pages()
    }

    pub fn num_cached_pages(&self) -> usize {
        self.prefix.num_cached_pages()
    }

    pub fn num_evictable_pages(&self) -> usize {
        self.prefix.num_evictable_pages()
    }

    /// Pages held by requests: owned by them or locked in the prefix cache.
    /// Zero whenever no request is running.
    pub fn num_used_pages(&self) -> usize {
        self.num_pages() - self.num_available_pages()
    }

    pub fn hit_tokens(&self) -> u64 {
        self.hit_tokens
    }

    /// Pages freed but still held for steps in flight.
    pub fn num_held_pages(&self) -> usize {
        self.held.iter().map(|(_, pages)| pages.len()).sum()
    }

    /// Step `step` was launched: pages freed from now on may be read by it.
    pub fn step_launched(&mut self, step: u64) {
        self.launched_step = step;
    }

    /// Step `step` is resolved (it ran to completion): the pages held for it
    /// and earlier steps go back to the pool.
    pub fn step_resolved(&mut self, step: u64) {
        self.resolved_step = step;
        let (ready, keep): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|(s, _)| *s <= step);
        self.held = keep;
        for (_, pages) in ready {
            self.pool.free_all(pages);
        }
    }

    /// Returns pages no request owns any more to the pool, or holds them while
    /// a launched step may still read them.
    fn free_pages(&mut self, pages: Vec<Page>) {
        if pages.is_empty() {
            return;
        }
        if self.launched_step > self.resolved_step {
            self.held.push((self.launched_step, pages));
        } else {
            self.pool.free_all(pages);
        }
    }

    /// Looks up the cached prefix of a sequence about to be prefilled. The
    /// last token is never matched: the model must run on at least one token
    /// to produce the logits of the next.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        assert!(!tokens.is_empty(), "cannot match an empty sequence");
        self.prefix.match_prefix(&tokens[..tokens.len() - 1])
    }

    /// Locks a match and makes it the start of a request's page table.
    pub fn acquire(&mut self, m: PrefixMatch) -> ReqPages {
        self.prefix.lock(m.node);
        self.hit_tokens += (m.pages.len() * self.page_size()) as u64;
        ReqPages { handle: CacheHandle { node: m.node, num_pages: m.pages.len() }, shared: m.pages, owned: Vec::new() }
    }

    /// Pages `pages` lacks to hold `num_tokens` tokens.
    pub fn pages_to_grow(&self, pages: &ReqPages, num_tokens: usize) -> usize {
        pages_for(num_tokens, self.page_size()).saturating_sub(pages.num_pages())
    }

    /// Grows `pages` to hold `num_tokens` tokens, evicting cached pages if
    /// the pool runs dry. The scheduler checks [`Self::num_available_pages`]
    /// first, so running out here is a bug.
    pub fn grow(&mut self, pages: &mut ReqPages, num_tokens: usize) {
        let num = self.pages_to_grow(pages, num_tokens);
        if num == 0 {
            return;
        }
        assert!(
            num <= self.num_available_pages(),
            "out of KV pages: need {num}, {} available",
            self.num_available_pages()
        );
        if num > self.pool.num_free() {
            let evicted = self.prefix.evict(num - self.pool.num_free());
            self.pool.free_all(evicted);
        }
        pages.owned.extend(self.pool.alloc(num));
        self.num_req_pages += num;
    }

    /// Puts the whole pages of a running request's computed tokens into the
    /// prefix cache, so that requests arriving later can reuse them. `tokens`
    /// are the tokens whose KV is valid (the request's `cached_len` prefix).
    pub fn cache_prefix(&mut self, tokens: &[u32], pages: &mut ReqPages) {
        let page_size = self.page_size();
        let num_full = tokens.len() / page_size;
        assert!(num_full <= pages.num_pages(), "{} tokens cannot live in {} pages", tokens.len(), pages.num_pages());
        if num_full <= pages.num_shared_pages() {
            return;
        }
        let owned_before = pages.owned.len();
        let duplicates = self.prefix.insert(&tokens[..num_full * page_size], pages);
        // Pages leave the request either into the cache or back to the pool.
        self.num_req_pages -= owned_before - pages.owned.len();
        // The request's page table held the duplicates until now: a step in
        // flight may still read them.
        self.free_pages(duplicates);
        debug_assert_eq!(pages.shared.len(), pages.handle.num_pages);
    }

    /// Returns a request's pages: the whole pages of its computed `tokens`
    /// go to the prefix cache (unlocked, hence evictable), the rest to the
    /// pool.
    pub fn release(&mut self, tokens: &[u32], mut pages: ReqPages) {
        self.cache_prefix(tokens, &mut pages);
        let ReqPages { handle, shared: _, owned } = pages;
        self.prefix.unlock(handle.node);
        self.num_req_pages -= owned.len();
        self.pool.free_all(owned);
    }

    /// Evicts every unlocked page of the prefix cache. With no request
    /// running, this leaves the whole pool free.
    pub fn flush(&mut self) {
        let num = self.prefix.num_evictable_pages();
        if num > 0 {
            let evicted = self.prefix.evict(num);
            self.pool.free_all(evicted);
        }
    }

    /// Asserts that every page is accounted for exactly once.
    pub fn check_integrity(&self) {
        self.prefix.check_integrity();
        assert_eq!(
            self.pool.num_free() + self.prefix.num_cached_pages() + self.num_req_pages + self.num_held_pages(),
            self.num_pages(),
            "page accounting: free {} + cached {} + owned by requests {} + held {} != total",
            self.pool.num_free(),
            self.prefix.num_cached_pages(),
            self.num_req_pages,
            self.num_held_pages(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + salt).collect()
    }

    #[test]
    fn radix_manager_shares_and_releases() {
        let mut cm = CacheManager::new(4, 16, CacheKind::Radix);
        let a = tokens(10, 0);
        let m = cm.match_prefix(&a);
        assert_eq!(m.num_pages(), 0);
        let mut pa = cm.acquire(m);
        cm.grow(&mut pa, a.len());
        assert_eq!(pa.num_pages(), 3);
        cm.check_integrity();
        // After prefill, the two full pages go to the cache and stay locked.
        cm.cache_prefix(&a, &mut pa);
        assert_eq!(pa.num_shared_pages(), 2);
        assert_eq!(cm.num_cached_pages(), 2);
        assert_eq!(cm.num_evictable_pages(), 0);
        cm.check_integrity();

        // A second request with the same first 9 tokens reuses both pages.
        let mut b = a[..9].to_vec();
        b.push(999);
        let m = cm.match_prefix(&b);
        assert_eq!(m.num_pages(), 2);
        assert_eq!(m.num_evictable_pages(), 0);
        let mut pb = cm.acquire(m);
        assert_eq!(cm.hit_tokens(), 8);
        cm.grow(&mut pb, b.len());
        let ids_a: Vec<PageId> = pa.page_ids().collect();
        let ids_b: Vec<PageId> = pb.page_ids().collect();
        assert_eq!(ids_a[..2], ids_b[..2]);
        assert_ne!(ids_a[2], ids_b[2]);

        cm.release(&a, pa);
        cm.release(&b, pb);
        cm.check_integrity();
        assert_eq!(cm.num_used_pages(), 0);
        assert_eq!(cm.num_cached_pages(), 2);
        cm.flush();
        assert_eq!(cm.num_free_pages(), 16);
        cm.check_integrity();
    }

    #[test]
    fn duplicate_pages_are_swapped_for_cached_ones() {
        let mut cm = CacheManager::new(2, 16, CacheKind::Radix);
        let a = tokens(7, 3);
        // Both requests start before either is cached, so both compute a copy.
        let mut pa = {
            let m = cm.match_prefix(&a);
            cm.acquire(m)
        };
        let mut pb = {
            let m = cm.match_prefix(&a);
            cm.acquire(m)
        };
        cm.grow(&mut pa, 7);
        cm.grow(&mut pb, 7);
        assert_eq!(cm.num_free_pages(), 16 - 8);
        cm.cache_prefix(&a, &mut pa);
        cm.cache_prefix(&a, &mut pb);
        // B's three full pages were duplicates: freed, and B now reads A's.
        assert_eq!(cm.num_free_pages(), 16 - 5);
        let ids_a: Vec<PageId> = pa.page_ids().collect();
        let ids_b: Vec<PageId> = pb.page_ids().collect();
        assert_eq!(ids_a[..3], ids_b[..3]);
        cm.check_integrity();
        cm.release(&a, pa);
        cm.release(&a, pb);
        assert_eq!(cm.num_used_pages(), 0);
        cm.flush();
        assert_eq!(cm.num_free_pages(), 16);
    }

    #[test]
    fn grow_evicts_when_the_pool_is_dry() {
        let mut cm = CacheManager::new(1, 4, CacheKind::Radix);
        let a = tokens(4, 0);
        let mut pa = {
            let m = cm.match_prefix(&a);
            cm.acquire(m)
        };
        cm.grow(&mut pa, 4);
        cm.release(&a, pa);
        assert_eq!(cm.num_free_pages(), 0);
        assert_eq!(cm.num_available_pages(), 4);
        let b = tokens(3, 7);
        let mut pb = {
            let m = cm.match_prefix(&b);
            cm.acquire(m)
        };
        cm.grow(&mut pb, 3);
        // Eviction takes whole nodes: A's single 4-page node went entirely.
        assert_eq!(cm.num_cached_pages(), 0);
        assert_eq!(cm.num_free_pages(), 1);
        cm.check_integrity();
        cm.release(&b, pb);
        cm.flush();
        assert_eq!(cm.num_free_pages(), 4);
    }

    #[test]
    fn naive_manager_never_shares() {
        let mut cm = CacheManager::new(4, 8, CacheKind::Naive);
        let a = tokens(9, 0);
        let mut pa = {
            let m = cm.match_prefix(&a);
            cm.acquire(m)
        };
        cm.grow(&mut pa, 9);
        cm.cache_prefix(&a, &mut pa);
        assert_eq!(cm.num_cached_pages(), 0);
        let m = cm.match_prefix(&a);
        assert_eq!(m.num_pages(), 0);
        let pb = cm.acquire(m);
        cm.release(&a, pa);
        cm.release(&[], pb);
        assert_eq!(cm.num_free_pages(), 8);
        assert_eq!(cm.hit_tokens(), 0);
        cm.check_integrity();
    }
}
