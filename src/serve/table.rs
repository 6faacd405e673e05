//! The page table of a batch, FlashInfer's CSR form in u32, and the checks every index passes
//! before anything is recorded (nothing a kernel reads crosses a sequence or the pool).

use crate::error::{Error, Result};

/// For `n` sequences: `kv_indptr [n + 1]` (prefix sums of pages per sequence), `kv_indices`
/// (page ids, each sequence's in order) and `kv_last_page_len [n]` (tokens in each sequence's
/// last page, 1 ..= page_size). A sequence holds `page_size · (pages − 1) + last_page_len`
/// tokens (0 when it lists no pages).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageTable {
    /// `[n + 1]`: sequence `s`'s pages are `kv_indices[kv_indptr[s]..kv_indptr[s + 1]]`.
    pub kv_indptr: Vec<u32>,
    /// Page ids, each sequence's in order.
    pub kv_indices: Vec<u32>,
    /// `[n]`: tokens in each sequence's last page, 1 ..= page_size (0 for a sequence with no pages).
    pub kv_last_page_len: Vec<u32>,
}

fn table_error(problem: String) -> Error {
    Error::PageTable(problem)
}

impl PageTable {
    /// Sequences in the table.
    pub fn sequences(&self) -> usize {
        self.kv_last_page_len.len()
    }

    /// The pages of sequence `s` (the table must have been checked).
    pub fn pages(&self, s: usize) -> &[u32] {
        &self.kv_indices[self.kv_indptr[s] as usize..self.kv_indptr[s + 1] as usize]
    }

    /// Tokens sequence `s` holds (the table must have been checked).
    pub fn tokens(&self, s: usize, page_size: usize) -> usize {
        let pages = self.pages(s).len();
        if pages == 0 {
            0
        } else {
            page_size * (pages - 1) + self.kv_last_page_len[s] as usize
        }
    }

    /// `Err(PageTable)` naming the first index that is wrong for a pool of `max_pages` pages
    /// of `page_size` tokens: lengths, `kv_indptr` not starting at 0, decreasing or not ending
    /// at `len(kv_indices)`, a page id past the pool, a last page length of 0 or past the
    /// page size.
    pub fn check(&self, max_pages: usize, page_size: usize) -> Result<()> {
        let n = self.kv_last_page_len.len();
        if self.kv_indptr.len() != n + 1 {
            return Err(table_error(format!(
                "kv_indptr has {} entries, expected len(kv_last_page_len) + 1 = {}",
                self.kv_indptr.len(),
                n + 1
            )));
        }
        if self.kv_indptr[0] != 0 {
            return Err(table_error(format!(
                "kv_indptr[0] is {}, expected 0",
                self.kv_indptr[0]
            )));
        }
        for s in 0..n {
            if self.kv_indptr[s + 1] < self.kv_indptr[s] {
                return Err(table_error(format!(
                    "kv_indptr is not non-decreasing: kv_indptr[{}] = {} < kv_indptr[{s}] = {}",
                    s + 1,
                    self.kv_indptr[s + 1],
                    self.kv_indptr[s]
                )));
            }
        }
        if self.kv_indptr[n] as usize != self.kv_indices.len() {
            return Err(table_error(format!(
                "kv_indptr ends at {}, but kv_indices has {} entries",
                self.kv_indptr[n],
                self.kv_indices.len()
            )));
        }
        if let Some((i, &page)) = self
            .kv_indices
            .iter()
            .enumerate()
            .find(|(_, &p)| p as usize >= max_pages)
        {
            return Err(table_error(format!(
                "kv_indices[{i}] is page {page}, past the pool's {max_pages} pages"
            )));
        }
        if let Some((s, &len)) = self
            .kv_last_page_len
            .iter()
            .enumerate()
            .find(|(_, &l)| l == 0 || l as usize > page_size)
        {
            return Err(table_error(format!(
                "kv_last_page_len[{s}] is {len}, expected 1 ..= page_size {page_size}"
            )));
        }
        Ok(())
    }
}

/// `Err(PageTable)` unless `qo_indptr` (query rows per sequence, as prefix sums) has `n + 1`
/// entries from 0, never decreasing, and — when the rows have positions (`positional`: causal,
/// a window or ALiBi, where a sequence's query rows are its last tokens) — gives no sequence
/// more query rows than tokens. Without positions any number of rows may attend a sequence's
/// keys (a shared prefix attended once for every sequence's rows). Returns each sequence's
/// query row count.
pub fn check_qo_indptr(
    qo_indptr: &[u32],
    tokens: &[usize],
    positional: bool,
) -> Result<Vec<usize>> {
    let n = tokens.len();
    if qo_indptr.len() != n + 1 {
        return Err(table_error(format!(
            "qo_indptr has {} entries, expected one more than the page table's {n} sequences",
            qo_indptr.len()
        )));
    }
    if qo_indptr[0] != 0 {
        return Err(table_error(format!(
            "qo_indptr[0] is {}, expected 0",
            qo_indptr[0]
        )));
    }
    let mut rows = Vec::with_capacity(n);
    for s in 0..n {
        let Some(q) = qo_indptr[s + 1].checked_sub(qo_indptr[s]) else {
            return Err(table_error(format!(
                "qo_indptr is not non-decreasing: qo_indptr[{}] = {} < qo_indptr[{s}] = {}",
                s + 1,
                qo_indptr[s + 1],
                qo_indptr[s]
            )));
        };
        if positional && q as usize > tokens[s] {
            return Err(table_error(format!(
                "sequence {s} has {q} query rows but holds only {} tokens (its query rows are \
                 its last tokens: append them first)",
                tokens[s]
            )));
        }
        rows.push(q as usize);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(indptr: &[u32], indices: &[u32], last: &[u32]) -> PageTable {
        PageTable {
            kv_indptr: indptr.to_vec(),
            kv_indices: indices.to_vec(),
            kv_last_page_len: last.to_vec(),
        }
    }

    #[test]
    fn tokens_follow_pages_and_the_last_length() {
        let t = table(&[0, 2, 2, 3], &[5, 1, 0], &[3, 1, 16]);
        t.check(6, 16).expect("valid");
        assert_eq!(t.tokens(0, 16), 19);
        assert_eq!(t.tokens(1, 16), 0);
        assert_eq!(t.tokens(2, 16), 16);
        assert_eq!(t.pages(0), &[5, 1]);
    }

    #[test]
    fn every_wrong_index_is_named() {
        let cases = [
            (table(&[0, 2], &[0, 1], &[1, 1]), "kv_indptr has 2 entries"),
            (table(&[1, 2], &[0, 1], &[1]), "kv_indptr[0] is 1"),
            (table(&[0, 2, 1], &[0, 1], &[1, 1]), "not non-decreasing"),
            (table(&[0, 1], &[0, 1], &[1]), "kv_indptr ends at 1"),
            (table(&[0, 2], &[0, 9], &[1]), "kv_indices[1] is page 9"),
            (table(&[0, 2], &[0, 1], &[0]), "kv_last_page_len[0] is 0"),
            (table(&[0, 2], &[0, 1], &[17]), "kv_last_page_len[0] is 17"),
        ];
        for (t, want) in cases {
            let err = t.check(4, 16).expect_err(want).to_string();
            assert!(err.contains(want), "{err} should name {want}");
        }
    }

    #[test]
    fn query_rows_are_checked_against_tokens() {
        assert_eq!(
            check_qo_indptr(&[0, 1, 4], &[5, 3], true).expect("ok"),
            vec![1, 3]
        );
        for (indptr, want) in [
            (vec![0, 1], "qo_indptr has 2 entries"),
            (vec![2, 3, 4], "qo_indptr[0] is 2"),
            (vec![0, 3, 2], "not non-decreasing"),
            (
                vec![0, 1, 5],
                "sequence 1 has 4 query rows but holds only 3",
            ),
        ] {
            let err = check_qo_indptr(&indptr, &[5, 3], true)
                .expect_err(want)
                .to_string();
            assert!(err.contains(want), "{err} should name {want}");
        }
        // Rows without positions may outnumber a sequence's tokens.
        assert_eq!(check_qo_indptr(&[0, 9], &[3], false).expect("ok"), vec![9]);
    }
}
