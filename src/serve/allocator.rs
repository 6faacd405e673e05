//! A host-side page allocator an engine may use (or replace with its own): free pages,
//! sequences as ordered page lists, pages shared by several sequences (a prompt prefix,
//! refcounted), and copy on write of a shared, partly filled last page. It never touches the
//! device: it says which slots new tokens go to and which pages to copy, and the engine records
//! those ([`super::PagedKvPool::record_copy_pages`], [`super::PagedKvPool::record_append`]).

use crate::error::{Error, Result};
use crate::serve::table::PageTable;

/// One sequence's pages and length. Made by [`PageAllocator::sequence`] or
/// [`PageAllocator::fork`]; give it back with [`PageAllocator::release`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sequence {
    pages: Vec<u32>,
    tokens: usize,
}

impl Sequence {
    /// The sequence's page ids, in order.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }
    /// Tokens the sequence holds.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// What [`PageAllocator::grow`] decided for `new` tokens of a sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Growth {
    /// Pages to copy before anything is appended (`(from, to)`): the shared last page the new
    /// tokens would otherwise write into.
    pub copies: Vec<(u32, u32)>,
    /// Each new token's slot, `page · page_size + offset`, in order.
    pub slots: Vec<i64>,
}

/// Free pages and how many sequences hold each page.
#[derive(Debug, Clone)]
pub struct PageAllocator {
    page_size: usize,
    refs: Vec<u32>,
    /// Free page ids, the lowest last (so pages are handed out from 0 up).
    free: Vec<u32>,
}

impl PageAllocator {
    /// All `max_pages` pages free.
    pub fn new(max_pages: usize, page_size: usize) -> Self {
        PageAllocator {
            page_size,
            refs: vec![0; max_pages],
            free: (0..max_pages as u32).rev().collect(),
        }
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// Pages in all, free or held.
    pub fn max_pages(&self) -> usize {
        self.refs.len()
    }
    /// Pages no sequence holds.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }
    /// Pages some sequence holds.
    pub fn used_pages(&self) -> usize {
        self.max_pages() - self.free.len()
    }

    /// A new, empty sequence (it holds no page until it grows).
    pub fn sequence(&self) -> Sequence {
        Sequence::default()
    }

    /// A sequence sharing every page of `parent` (its prompt prefix): each page's count goes
    /// up; whichever grows into a shared, partly filled last page first copies it.
    pub fn fork(&mut self, parent: &Sequence) -> Sequence {
        for &p in &parent.pages {
            self.refs[p as usize] += 1;
        }
        parent.clone()
    }

    /// Room for `new` more tokens of `seq`: copies its last page first if that page is shared
    /// and partly filled (copy on write), then takes the pages the tokens need. All or nothing:
    /// `Err(PagesExhausted)` naming the pool and what was asked, with `seq` and the pool as they
    /// were.
    pub fn grow(&mut self, seq: &mut Sequence, new: usize) -> Result<Growth> {
        let ps = self.page_size;
        let in_last = seq.tokens % ps;
        let shared_tail =
            in_last != 0 && new > 0 && seq.pages.last().is_some_and(|&p| self.refs[p as usize] > 1);
        let room = if in_last == 0 { 0 } else { ps - in_last };
        let fresh = new.saturating_sub(room).div_ceil(ps);
        let asked = fresh + shared_tail as usize;
        if asked > self.free.len() {
            return Err(Error::PagesExhausted {
                asked,
                free: self.free.len(),
                max_pages: self.max_pages(),
            });
        }
        let mut growth = Growth::default();
        // The pages asked for, in the order the free list hands them out (its end first).
        let mut taken = self.free.split_off(self.free.len() - asked);
        taken.reverse();
        for &page in &taken {
            self.refs[page as usize] = 1;
        }
        let mut taken = taken.into_iter();
        // A shared, partly filled last page is copied to the first page taken (asked counts it).
        let copy_to = if shared_tail { taken.next() } else { None };
        if let Some(to) = copy_to {
            let last = seq.pages.len() - 1;
            let from = seq.pages[last];
            self.refs[from as usize] -= 1;
            seq.pages[last] = to;
            growth.copies.push((from, to));
        }
        seq.pages.extend(taken);
        for t in seq.tokens..seq.tokens + new {
            growth
                .slots
                .push((seq.pages[t / ps] as usize * ps + t % ps) as i64);
        }
        seq.tokens += new;
        Ok(growth)
    }

    /// Gives `seq`'s pages back: each page's count goes down, and a page no sequence holds is
    /// free again.
    pub fn release(&mut self, seq: Sequence) {
        for p in seq.pages {
            let r = &mut self.refs[p as usize];
            *r -= 1;
            if *r == 0 {
                self.free.push(p);
            }
        }
        // Lowest ids last, so the next pages handed out are deterministic.
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// The CSR table of `seqs`, in order.
    pub fn table(&self, seqs: &[&Sequence]) -> PageTable {
        let mut t = PageTable {
            kv_indptr: vec![0],
            ..Default::default()
        };
        for s in seqs {
            t.kv_indices.extend_from_slice(&s.pages);
            t.kv_indptr.push(t.kv_indices.len() as u32);
            let last = match s.tokens % self.page_size {
                0 if s.tokens > 0 => self.page_size,
                0 => 1,
                r => r,
            };
            t.kv_last_page_len.push(last as u32);
        }
        t
    }

    /// `Err(PageTable)` naming the first page of `table` that no sequence holds (freed, or
    /// never handed out): such a page may already hold another sequence's tokens.
    pub fn check_held(&self, table: &PageTable) -> Result<()> {
        for (i, &p) in table.kv_indices.iter().enumerate() {
            if self.refs.get(p as usize).is_none_or(|&r| r == 0) {
                return Err(Error::PageTable(format!(
                    "kv_indices[{i}] is page {p}, which is free (a freed page still in a table)"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_grow_into_their_own_pages_and_give_them_back() {
        let mut a = PageAllocator::new(4, 4);
        let mut s = a.sequence();
        let g = a.grow(&mut s, 6).expect("room");
        assert_eq!(s.pages(), &[0, 1]);
        assert_eq!(g.slots, vec![0, 1, 2, 3, 4, 5]);
        let g = a.grow(&mut s, 3).expect("room");
        assert_eq!(g.slots, vec![6, 7, 8]);
        assert_eq!(s.pages(), &[0, 1, 2]);
        assert_eq!(a.table(&[&s]).kv_last_page_len, vec![1]);
        a.release(s);
        assert_eq!(a.free_pages(), 4);
    }

    #[test]
    fn a_shared_partly_filled_page_is_copied_before_it_is_written() {
        let mut a = PageAllocator::new(8, 4);
        let mut prompt = a.sequence();
        a.grow(&mut prompt, 6).expect("room"); // pages 0, 1 (2 of 4 used)
        let mut child = a.fork(&prompt);
        assert_eq!(a.used_pages(), 2);
        let g = a.grow(&mut child, 1).expect("room");
        assert_eq!(g.copies, vec![(1, 2)]);
        assert_eq!(child.pages(), &[0, 2]);
        assert_eq!(g.slots, vec![2 * 4 + 2]);
        // The parent's last page is its own again: no copy.
        let g = a.grow(&mut prompt, 1).expect("room");
        assert!(g.copies.is_empty());
        a.release(prompt);
        assert_eq!(a.used_pages(), 2, "page 0 is still the child's");
        a.release(child);
        assert_eq!(a.free_pages(), 8);
    }

    #[test]
    fn running_out_changes_nothing() {
        let mut a = PageAllocator::new(2, 4);
        let mut s = a.sequence();
        a.grow(&mut s, 5).expect("room");
        let before = (s.clone(), a.free_pages());
        let err = a
            .grow(&mut s, 8)
            .expect_err("only 3 slots and no page left");
        assert!(
            err.to_string()
                .contains("2 pages asked, 0 free of the pool's 2"),
            "{err}"
        );
        assert_eq!((s, a.free_pages()), before);
    }

    #[test]
    fn a_freed_page_in_a_table_is_named() {
        let mut a = PageAllocator::new(4, 4);
        let mut s = a.sequence();
        a.grow(&mut s, 4).expect("room");
        let table = a.table(&[&s]);
        a.check_held(&table).expect("held");
        a.release(s);
        let err = a.check_held(&table).expect_err("freed").to_string();
        assert!(
            err.contains("kv_indices[0] is page 0, which is free"),
            "{err}"
        );
    }
}
