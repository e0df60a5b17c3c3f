//! The naive prefix cache (`--cache naive`): caches nothing.
//!
//! Every match is empty and every insert leaves the request's pages with the
//! request, so they go straight back to the pool when it finishes. Useful as
//! a baseline and to rule the radix tree out when chasing a wrong output.

use super::pool::Page;
use super::prefix::{CacheHandle, NodeId, PrefixCache, PrefixMatch, ReqPages};

#[derive(Debug, Default)]
pub struct NaiveCache;

impl NaiveCache {
    pub fn new() -> Self {
        NaiveCache
    }
}

impl PrefixCache for NaiveCache {
    fn match_prefix(&mut self, _tokens: &[u32]) -> PrefixMatch {
        PrefixMatch { node: NodeId::ROOT, pages: Vec::new(), num_evictable_pages: 0 }
    }

    fn lock(&mut self, node: NodeId) {
        assert_eq!(node, NodeId::ROOT, "the naive cache has no other node");
    }

    fn unlock(&mut self, node: NodeId) {
        assert_eq!(node, NodeId::ROOT, "the naive cache has no other node");
    }

    fn insert(&mut self, _tokens: &[u32], pages: &mut ReqPages) -> Vec<Page> {
        debug_assert_eq!(pages.handle, CacheHandle::root());
        Vec::new()
    }

    fn evict(&mut self, num_pages: usize) -> Vec<Page> {
        assert_eq!(num_pages, 0, "the naive cache holds no pages");
        Vec::new()
    }

    fn num_cached_pages(&self) -> usize {
        0
    }

    fn num_evictable_pages(&self) -> usize {
        0
    }

    fn check_integrity(&self) {}
}
