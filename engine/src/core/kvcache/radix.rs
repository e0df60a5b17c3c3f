//! The radix prefix cache (`--cache radix`): a radix tree over token ids
//! whose edges are whole KV pages.
//!
//! Each node below the root holds a run of tokens (a multiple of `page_size`
//! long) and the pages that store their KV; the path from the root spells a
//! cached prefix. Children are keyed by their first page of tokens, so two
//! children of a node never start with the same page. Matching and inserting
//! walk the tree page by page and split a node when a sequence leaves it part
//! way (always on a page boundary), so every match ends exactly on a node.
//!
//! Reference counts protect pages in use: locking a node increments it and
//! all its ancestors, and only nodes with a zero count (and no children) can
//! be evicted. Eviction removes such leaves in least-recently-used order,
//! where "use" is a match or insert walking through the node; a parent whose
//! last child goes becomes a candidate in turn.
//!
//! Reference: mini-sglang `kvcache/radix_manager.py`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::pool::{Page, PageId};
use super::prefix::{CacheHandle, NodeId, PrefixCache, PrefixMatch, ReqPages};

#[derive(Debug)]
struct Node {
    /// `None` for the root only.
    parent: Option<NodeId>,
    /// Tokens of this edge. Invariant: `key.len() == pages.len() * page_size`,
    /// non-empty except at the root.
    key: Vec<u32>,
    pages: Vec<Page>,
    /// Keyed by the child's first page of tokens.
    children: HashMap<Box<[u32]>, NodeId>,
    /// Number of locks held on this node or a descendant.
    ref_count: usize,
    /// Logical time of the last walk through this node.
    last_access: u64,
}

#[derive(Debug)]
pub struct RadixCache {
    page_size: usize,
    /// Arena of nodes; `None` marks a vacant slot listed in `vacant`.
    nodes: Vec<Option<Node>>,
    vacant: Vec<usize>,
    clock: u64,
    num_cached_pages: usize,
    num_evictable_pages: usize,
}

impl RadixCache {
    pub fn new(page_size: usize) -> Self {
        assert!(page_size > 0, "page_size must be positive");
        let root = Node {
            parent: None,
            key: Vec::new(),
            pages: Vec::new(),
            children: HashMap::new(),
            ref_count: 0,
            last_access: 0,
        };
        Self {
            page_size,
            nodes: vec![Some(root)],
            vacant: Vec::new(),
            clock: 0,
            num_cached_pages: 0,
            num_evictable_pages: 0,
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id.0].as_ref().expect("dangling radix node id")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id.0].as_mut().expect("dangling radix node id")
    }

    fn add_node(&mut self, node: Node) -> NodeId {
        match self.vacant.pop() {
            Some(idx) => {
                self.nodes[idx] = Some(node);
                NodeId(idx)
            }
            None => {
                self.nodes.push(Some(node));
                NodeId(self.nodes.len() - 1)
            }
        }
    }

    /// Follows `tokens` (whole pages only) from the root as far as the tree
    /// has them, splitting the last node if the walk leaves it part way.
    /// Returns the node where the walk ends and the number of pages matched.
    fn walk(&mut self, tokens: &[u32]) -> (NodeId, usize) {
        let ps = self.page_size;
        let total = tokens.len() / ps;
        self.clock += 1;
        let now = self.clock;
        let mut node = NodeId::ROOT;
        let mut matched = 0;
        while matched < total {
            let first = &tokens[matched * ps..(matched + 1) * ps];
            let Some(&child) = self.node(node).children.get(first) else {
                break;
            };
            let child_node = self.node(child);
            let child_pages = child_node.pages.len();
            // The first page matched through the children key.
            let mut k = 1;
            while k < child_pages
                && matched + k < total
                && child_node.key[k * ps..(k + 1) * ps] == tokens[(matched + k) * ps..(matched + k + 1) * ps]
            {
                k += 1;
            }
            self.node_mut(child).last_access = now;
            matched += k;
            if k < child_pages {
                node = self.split(child, k);
                break;
            }
            node = child;
        }
        (node, matched)
    }

    /// Splits `id` after its first `num_pages` pages: a new node takes that
    /// head and becomes `id`'s parent. `id` keeps its identity (handles to it
    /// stay valid) and the new node inherits its reference count, since every
    /// lock through `id` also passes through the new node.
    fn split(&mut self, id: NodeId, num_pages: usize) -> NodeId {
        let ps = self.page_size;
        let (parent, head_key, head_pages, ref_count, last_access) = {
            let node = self.node_mut(id);
            assert!(0 < num_pages && num_pages < node.pages.len(), "split must leave both halves non-empty");
            let head_key: Vec<u32> = node.key.drain(..num_pages * ps).collect();
            let head_pages: Vec<Page> = node.pages.drain(..num_pages).collect();
            (node.parent.expect("the root is never split"), head_key, head_pages, node.ref_count, node.last_access)
        };
        let first: Box<[u32]> = head_key[..ps].into();
        let tail_first: Box<[u32]> = self.node(id).key[..ps].into();
        let head = self.add_node(Node {
            parent: Some(parent),
            key: head_key,
            pages: head_pages,
            children: HashMap::from([(tail_first, id)]),
            ref_count,
            last_access,
        });
        self.node_mut(id).parent = Some(head);
        let replaced = self.node_mut(parent).children.insert(first, head);
        debug_assert_eq!(replaced, Some(id));
        head
    }

    /// Page ids from the root down to `id`.
    fn path_pages(&self, id: NodeId) -> Vec<PageId> {
        let mut runs = Vec::new();
        let mut cur = Some(id);
        while let Some(n) = cur {
            let node = self.node(n);
            runs.push(node.pages.iter().map(Page::id).collect::<Vec<_>>());
            cur = node.parent;
        }
        runs.into_iter().rev().flatten().collect()
    }

    fn is_evictable_leaf(&self, id: NodeId) -> bool {
        let node = self.node(id);
        id != NodeId::ROOT && node.ref_count == 0 && node.children.is_empty()
    }
}

impl PrefixCache for RadixCache {
    fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let (node, _) = self.walk(tokens);
        let mut num_evictable_pages = 0;
        let mut cur = Some(node);
        while let Some(n) = cur {
            let node = self.node(n);
            if node.ref_count == 0 {
                num_evictable_pages += node.pages.len();
            }
            cur = node.parent;
        }
        PrefixMatch { node, pages: self.path_pages(node), num_evictable_pages }
    }

    fn lock(&mut self, id: NodeId) {
        let mut cur = Some(id);
        while let Some(n) = cur {
            if n == NodeId::ROOT {
                break;
            }
            let node = self.node_mut(n);
            node.ref_count += 1;
            let newly_locked = (node.ref_count == 1).then_some(node.pages.len());
            cur = node.parent;
            if let Some(num) = newly_locked {
                self.num_evictable_pages -= num;
            }
        }
    }

    fn unlock(&mut self, id: NodeId) {
        let mut cur = Some(id);
        while let Some(n) = cur {
            if n == NodeId::ROOT {
                break;
            }
            let node = self.node_mut(n);
            assert!(node.ref_count > 0, "unlock of an unlocked radix node");
            node.ref_count -= 1;
            let newly_free = (node.ref_count == 0).then_some(node.pages.len());
            cur = node.parent;
            if let Some(num) = newly_free {
                self.num_evictable_pages += num;
            }
        }
    }

    fn insert(&mut self, tokens: &[u32], pages: &mut ReqPages) -> Vec<Page> {
        let ps = self.page_size;
        assert_eq!(tokens.len() % ps, 0, "insert takes whole pages");
        let num_new = tokens.len() / ps;
        let num_shared = pages.shared.len();
        assert!(
            num_shared <= num_new && num_new <= pages.num_pages(),
            "insert must extend the request's shared prefix"
        );

        let (end, num_existing) = self.walk(tokens);
        // The request's locked path is a prefix of `tokens` and cannot have
        // been evicted, so the walk gets at least that far.
        assert!(num_existing >= num_shared, "locked prefix missing from the radix tree");

        // Pages [num_shared, num_existing) were computed again by this
        // request while someone else cached them: they are duplicates.
        let duplicates: Vec<Page> = pages.owned.drain(..num_existing - num_shared).collect();
        let new_end = if num_new > num_existing {
            let fresh: Vec<Page> = pages.owned.drain(..num_new - num_existing).collect();
            let key = tokens[num_existing * ps..].to_vec();
            let first: Box<[u32]> = key[..ps].into();
            self.num_cached_pages += fresh.len();
            self.num_evictable_pages += fresh.len();
            let leaf = self.add_node(Node {
                parent: Some(end),
                key,
                pages: fresh,
                children: HashMap::new(),
                ref_count: 0,
                last_access: self.clock,
            });
            let previous = self.node_mut(end).children.insert(first, leaf);
            assert!(previous.is_none(), "walk stopped before an existing child");
            leaf
        } else {
            end
        };

        // Lock the new path before unlocking the old one, which it contains.
        self.lock(new_end);
        let old = std::mem::replace(&mut pages.handle, CacheHandle { node: new_end, num_pages: num_new });
        self.unlock(old.node);
        pages.shared = self.path_pages(new_end);
        debug_assert_eq!(pages.shared.len(), num_new);
        duplicates
    }

    fn evict(&mut self, num_pages: usize) -> Vec<Page> {
        assert!(
            num_pages <= self.num_evictable_pages,
            "cannot evict {num_pages} pages, only {} evictable",
            self.num_evictable_pages
        );
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = BinaryHeap::new();
        for (idx, slot) in self.nodes.iter().enumerate() {
            if slot.is_some() && self.is_evictable_leaf(NodeId(idx)) {
                heap.push(Reverse((self.node(NodeId(idx)).last_access, NodeId(idx))));
            }
        }
        let mut evicted = Vec::new();
        while evicted.len() < num_pages {
            let Reverse((_, id)) = heap.pop().expect("evictable count says more pages can go");
            let node = self.nodes[id.0].take().expect("dangling radix node id");
            self.vacant.push(id.0);
            let parent = node.parent.expect("the root is never evicted");
            let ps = self.page_size;
            let removed = self.node_mut(parent).children.remove(&node.key[..ps]);
            debug_assert_eq!(removed, Some(id));
            self.num_cached_pages -= node.pages.len();
            self.num_evictable_pages -= node.pages.len();
            evicted.extend(node.pages);
            if self.is_evictable_leaf(parent) {
                heap.push(Reverse((self.node(parent).last_access, parent)));
            }
        }
        evicted
    }

    fn num_cached_pages(&self) -> usize {
        self.num_cached_pages
    }

    fn num_evictable_pages(&self) -> usize {
        self.num_evictable_pages
    }

    fn check_integrity(&self) {
        let ps = self.page_size;
        let mut cached = 0;
        let mut evictable = 0;
        for (idx, slot) in self.nodes.iter().enumerate() {
            let Some(node) = slot else { continue };
            let id = NodeId(idx);
            assert_eq!(node.key.len(), node.pages.len() * ps, "radix node {idx}: key and pages disagree");
            assert_eq!(node.parent.is_none(), id == NodeId::ROOT, "radix node {idx}: only the root lacks a parent");
            if let Some(parent) = node.parent {
                assert!(!node.pages.is_empty(), "radix node {idx} is empty");
                assert_eq!(
                    self.node(parent).children.get(&node.key[..ps]),
                    Some(&id),
                    "radix node {idx}: parent lost it"
                );
                assert!(self.node(parent).ref_count >= node.ref_count || parent == NodeId::ROOT);
            }
            let child_refs: usize = node.children.values().map(|&c| self.node(c).ref_count).sum();
            assert!(
                node.ref_count >= child_refs || id == NodeId::ROOT,
                "radix node {idx}: ref count below its children's"
            );
            cached += node.pages.len();
            if node.ref_count == 0 {
                evictable += node.pages.len();
            }
        }
        assert_eq!(cached, self.num_cached_pages, "radix cached page count drifted");
        assert_eq!(evictable, self.num_evictable_pages, "radix evictable page count drifted");
    }
}

#[cfg(test)]
mod tests {
    use super::super::pool::PagePool;
    use super::super::prefix::ReqPages;
    use super::*;

    /// A tree plus the pool its pages come from, driven the way
    /// `CacheManager` drives it.
    struct Fixture {
        pool: PagePool,
        tree: RadixCache,
    }

    impl Fixture {
        fn new(page_size: usize, num_pages: usize) -> Self {
            Self { pool: PagePool::new(page_size, num_pages), tree: RadixCache::new(page_size) }
        }

        /// Matches, locks and fills a request holding `tokens`, then inserts
        /// its whole pages. Returns its (still locked) pages.
        fn run(&mut self, tokens: &[u32]) -> ReqPages {
            let ps = self.pool.page_size();
            let m = self.tree.match_prefix(tokens);
            self.tree.lock(m.node);
            let mut pages = ReqPages {
                handle: CacheHandle { node: m.node, num_pages: m.pages.len() },
                shared: m.pages,
                owned: Vec::new(),
            };
            let need = tokens.len().div_ceil(ps) - pages.num_pages();
            pages.owned.extend(self.pool.alloc(need));
            let full = tokens.len() / ps * ps;
            let dup = self.tree.insert(&tokens[..full], &mut pages);
            self.pool.free_all(dup);
            self.tree.check_integrity();
            pages
        }

        fn release(&mut self, pages: ReqPages) {
            self.tree.unlock(pages.handle.node);
            self.pool.free_all(pages.owned);
            self.tree.check_integrity();
        }

        fn matched_pages(&mut self, tokens: &[u32]) -> usize {
            self.tree.match_prefix(tokens).pages.len()
        }
    }

    fn seq(pages: &[u32], page_size: usize) -> Vec<u32> {
        pages.iter().flat_map(|&p| (0..page_size as u32).map(move |i| p * 100 + i)).collect()
    }

    #[test]
    fn match_is_whole_pages_and_longest() {
        let mut f = Fixture::new(4, 32);
        let a = f.run(&seq(&[1, 2, 3], 4));
        f.release(a);
        assert_eq!(f.matched_pages(&seq(&[1, 2, 3, 4], 4)), 3);
        assert_eq!(f.matched_pages(&seq(&[1, 2], 4)), 2);
        assert_eq!(f.matched_pages(&seq(&[2], 4)), 0);
        // A partial last page does not match.
        let mut t = seq(&[1, 2], 4);
        t.truncate(7);
        assert_eq!(f.matched_pages(&t), 1);
        // A difference inside a page stops the match before that page.
        let mut t = seq(&[1, 2, 3], 4);
        t[5] = 0;
        assert_eq!(f.matched_pages(&t), 1);
        f.tree.check_integrity();
    }

    #[test]
    fn insert_splits_and_shares_pages() {
        let mut f = Fixture::new(2, 32);
        let a = f.run(&seq(&[1, 2, 3, 4], 2));
        let a_ids: Vec<PageId> = a.page_ids().collect();
        // B shares two pages with A, then diverges: A's node is split.
        let b = f.run(&seq(&[1, 2, 7], 2));
        let b_ids: Vec<PageId> = b.page_ids().collect();
        assert_eq!(a_ids[..2], b_ids[..2]);
        assert_ne!(a_ids[2], b_ids[2]);
        assert_eq!(f.tree.num_cached_pages(), 5);
        assert_eq!(f.tree.num_evictable_pages(), 0);
        // Root -> [1,2] -> {[3,4], [7]}.
        let live = f.tree.nodes.iter().filter(|n| n.is_some()).count();
        assert_eq!(live, 4);
        // The split kept A's handle valid: its path still spells A's pages.
        assert_eq!(f.tree.path_pages(a.handle.node), a_ids);
        f.release(a);
        assert_eq!(f.tree.num_evictable_pages(), 2);
        f.release(b);
        assert_eq!(f.tree.num_evictable_pages(), 5);
        assert_eq!(f.pool.num_free(), 32 - 5);
    }

    #[test]
    fn insert_of_an_existing_prefix_frees_duplicates() {
        let mut f = Fixture::new(1, 16);
        let a = f.run(&seq(&[1, 2, 3], 1));
        // B allocates its own three pages before learning that A cached them.
        let mut b = ReqPages { handle: CacheHandle::root(), shared: Vec::new(), owned: f.pool.alloc(3) };
        f.tree.lock(NodeId::ROOT);
        let dup = f.tree.insert(&seq(&[1, 2, 3], 1), &mut b);
        assert_eq!(dup.len(), 3);
        f.pool.free_all(dup);
        assert_eq!(b.page_ids().collect::<Vec<_>>(), a.page_ids().collect::<Vec<_>>());
        f.release(a);
        f.release(b);
        assert_eq!(f.pool.num_free() + f.tree.num_cached_pages(), 16);
    }

    #[test]
    fn locked_pages_are_never_evicted() {
        let mut f = Fixture::new(2, 16);
        let a = f.run(&seq(&[1, 2], 2));
        let b = f.run(&seq(&[1, 3], 2));
        f.release(b);
        // Only B's own page ([3]) is evictable; [1] is locked through A.
        assert_eq!(f.tree.num_evictable_pages(), 1);
        let evicted = f.tree.evict(1);
        assert_eq!(evicted.len(), 1);
        f.pool.free_all(evicted);
        f.tree.check_integrity();
        assert_eq!(f.tree.num_evictable_pages(), 0);
        assert_eq!(f.matched_pages(&seq(&[1, 2, 9], 2)), 2);
        assert_eq!(f.matched_pages(&seq(&[1, 3, 9], 2)), 1);
        f.release(a);
        let all = f.tree.evict(2);
        assert_eq!(all.len(), 2);
        f.pool.free_all(all);
        assert_eq!(f.tree.num_cached_pages(), 0);
        assert_eq!(f.pool.num_free(), 16);
        f.tree.check_integrity();
    }

    #[test]
    fn eviction_is_least_recently_used_first() {
        let mut f = Fixture::new(1, 16);
        for first in [1, 2, 3] {
            let p = f.run(&seq(&[first, 10 + first], 1));
            f.release(p);
        }
        // Touch [1, 11] so that [2, 12] becomes the oldest.
        assert_eq!(f.matched_pages(&seq(&[1, 11], 1)), 2);
        let evicted = f.tree.evict(2);
        f.pool.free_all(evicted);
        assert_eq!(f.matched_pages(&seq(&[2, 12], 1)), 0);
        assert_eq!(f.matched_pages(&seq(&[1, 11], 1)), 2);
        assert_eq!(f.matched_pages(&seq(&[3, 13], 1)), 2);
        // Touch [3, 13] last: [1, 11] is now the oldest, and a node goes
        // whole even when fewer pages were asked for.
        assert_eq!(f.matched_pages(&seq(&[3, 13], 1)), 2);
        let evicted = f.tree.evict(1);
        assert_eq!(evicted.len(), 2);
        f.pool.free_all(evicted);
        assert_eq!(f.matched_pages(&seq(&[1, 11], 1)), 0);
        assert_eq!(f.matched_pages(&seq(&[3, 13], 1)), 2);
        f.tree.check_integrity();
    }

    #[test]
    fn evicting_a_leaf_makes_its_parent_a_candidate() {
        let mut f = Fixture::new(1, 16);
        let a = f.run(&seq(&[1, 2, 3], 1));
        let b = f.run(&seq(&[1, 2, 4], 1));
        f.release(a);
        f.release(b);
        // Tree: [1,2] -> {[3], [4]}. Evicting 4 pages must take both leaves
        // and then their parent.
        let evicted = f.tree.evict(4);
        assert_eq!(evicted.len(), 4);
        f.pool.free_all(evicted);
        assert_eq!(f.tree.num_cached_pages(), 0);
        f.tree.check_integrity();
    }
}
