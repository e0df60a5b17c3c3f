//! The KV page pool: which of the `num_pages` pages of the KV cache are free.
//!
//! A page holds the keys and values of `page_size` consecutive tokens of one
//! sequence, in every layer (the model's KV tensors are
//! `[num_pages, page_size, num_kv_heads, head_dim]` per layer). The token at
//! position `p` of a sequence lives in KV slot
//! `page_table[p / page_size] * page_size + p % page_size`.
//!
//! Ownership of a page is a value: [`PagePool::alloc`] hands out [`Page`]s,
//! which are neither `Clone` nor `Copy`, and [`PagePool::free`] takes them
//! back by value. A page is therefore owned by exactly one place at a time (the
//! free list, one request, or one radix node), and freeing a page twice does
//! not compile. Code that only needs to *read* a page (block tables, shared
//! prefixes) uses the plain [`PageId`].

use std::fmt;

/// The index of a KV page, `0..num_pages`. Copyable: it grants no ownership.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageId(u32);

impl PageId {
    /// The page index as the `u32` the block tables and kernels use.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The KV slot of the token at `offset` inside this page.
    pub fn slot(self, page_size: usize, offset: usize) -> u32 {
        debug_assert!(offset < page_size);
        self.0 * page_size as u32 + offset as u32
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

/// An allocated page: the right to write its KV slots and the duty to give it
/// back. Only [`PagePool::alloc`] creates one.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a page that is dropped instead of freed leaks KV memory"]
pub struct Page(PageId);

impl Page {
    pub fn id(&self) -> PageId {
        self.0
    }
}

/// The free list of KV pages.
#[derive(Debug)]
pub struct PagePool {
    page_size: usize,
    num_pages: usize,
    /// Free pages, popped from the back. Initially in descending order so that
    /// a fresh pool hands out pages 0, 1, 2, ... (deterministic traces).
    free: Vec<PageId>,
    /// `is_free[p]` mirrors membership of `free`, to catch a page that comes
    /// back while already free (only possible through a bug in this module).
    is_free: Vec<bool>,
}

impl PagePool {
    pub fn new(page_size: usize, num_pages: usize) -> Self {
        assert!(page_size > 0, "page_size must be positive");
        assert!(num_pages > 0, "num_pages must be positive");
        assert!(
            num_pages.checked_mul(page_size).is_some_and(|slots| slots <= u32::MAX as usize),
            "num_pages * page_size must fit the u32 KV slot indices"
        );
        let free = (0..num_pages as u32).rev().map(PageId).collect();
        Self { page_size, num_pages, free, is_free: vec![true; num_pages] }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Takes `num` free pages. The caller checks [`Self::num_free`] first:
    /// running out is a scheduling decision, never a surprise here.
    pub fn alloc(&mut self, num: usize) -> Vec<Page> {
        assert!(num <= self.free.len(), "page pool exhausted: asked for {num} pages, {} free", self.free.len());
        let start = self.free.len() - num;
        let pages: Vec<Page> = self.free.drain(start..).rev().map(Page).collect();
        for page in &pages {
            self.is_free[page.0 .0 as usize] = false;
        }
        pages
    }

    pub fn free(&mut self, page: Page) {
        let idx = page.0 .0 as usize;
        assert!(!self.is_free[idx], "{} freed twice", page.0);
        self.is_free[idx] = true;
        self.free.push(page.0);
    }

    pub fn free_all(&mut self, pages: impl IntoIterator<Item = Page>) {
        for page in pages {
            self.free(page);
        }
    }
}

/// Number of pages needed to hold `num_tokens` tokens.
pub fn pages_for(num_tokens: usize, page_size: usize) -> usize {
    num_tokens.div_ceil(page_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_pool_hands_out_pages_in_order() {
        let mut pool = PagePool::new(4, 8);
        let pages = pool.alloc(3);
        let ids: Vec<u32> = pages.iter().map(|p| p.id().get()).collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(pool.num_free(), 5);
        pool.free_all(pages);
        assert_eq!(pool.num_free(), 8);
    }

    #[test]
    fn slots_of_a_page_with_page_size_above_one() {
        let mut pool = PagePool::new(16, 4);
        let pages = pool.alloc(2);
        assert_eq!(pages[1].id().slot(16, 0), 16);
        assert_eq!(pages[1].id().slot(16, 15), 31);
        assert_eq!(pages_for(0, 16), 0);
        assert_eq!(pages_for(1, 16), 1);
        assert_eq!(pages_for(16, 16), 1);
        assert_eq!(pages_for(17, 16), 2);
        pool.free_all(pages);
    }

    #[test]
    fn exhaustion_is_visible_before_alloc() {
        let mut pool = PagePool::new(2, 3);
        let a = pool.alloc(3);
        assert_eq!(pool.num_free(), 0);
        let b = pool.alloc(0);
        assert!(b.is_empty());
        // Whatever order pages come back in, they can all be handed out again.
        let mut a = a;
        let last = a.pop().unwrap();
        pool.free(last);
        let again = pool.alloc(1);
        assert_eq!(again.len(), 1);
        pool.free_all(again);
        pool.free_all(a);
        let all = pool.alloc(3);
        let mut ids: Vec<u32> = all.iter().map(|p| p.id().get()).collect();
        ids.sort();
        assert_eq!(ids, [0, 1, 2]);
        pool.free_all(all);
    }

    /// Double free is prevented by construction: `Page` is moved into `free`,
    /// so a second `pool.free(page)` is a use-after-move compile error. What can
    /// be checked at run time is that pages never duplicate through the pool.
    #[test]
    fn pages_are_unique_across_alloc_free_cycles() {
        let mut pool = PagePool::new(1, 16);
        let mut held: Vec<Page> = Vec::new();
        for round in 0..50usize {
            let n = (round * 7) % 5;
            if n <= pool.num_free() {
                held.extend(pool.alloc(n));
            }
            if round % 3 == 0 {
                let keep = held.len() / 2;
                pool.free_all(held.drain(keep..));
            }
            let mut ids: Vec<u32> = held.iter().map(|p| p.id().get()).collect();
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), held.len());
            assert_eq!(held.len() + pool.num_free(), 16);
        }
        pool.free_all(held);
    }
}
