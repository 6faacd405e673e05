//! How a plan divides a step's work: every sequence's query rows into blocks of a pass's
//! (row, head) slots, and their keys into chunks that fill the device — the work list the
//! paged passes read (see `super::plan`).

use crate::kernels::paged_attention::{DIRECT, ITEM_WORDS, SEQ_WORDS};
use crate::serve::inputs::PlanInputs;

/// The host side of a plan: every table the shader reads, as u32 words.
pub(super) struct WorkList {
    /// Each part's items (see [`work_list`]).
    pub items: Vec<Vec<u32>>,
    pub seqs: Vec<u32>,
    pub rows: Vec<u32>,
    pub partial_rows: usize,
    pub chunk_keys: usize,
}

/// How a pass takes its work: (row, head) slots per item, keys in whole granules (tiles, or
/// runs of lanes), at most `max_chunk` keys an item.
#[derive(Debug, Clone, Copy)]
pub(super) struct Split {
    pub slots: usize,
    pub granule: usize,
    pub max_chunk: usize,
}

/// One sequence's block of query rows and the keys they see.
struct RowBlock {
    part: usize,
    seq: usize,
    row0: usize,
    rows: usize,
    keys: (usize, usize),
}

/// How a part's items carry the query heads of a KV head: heads per item, items per group,
/// rows per item.
fn head_blocks(split: Split, group: usize) -> (usize, usize, usize) {
    let heads_per_item = group.min(split.slots);
    (
        heads_per_item,
        group.div_ceil(heads_per_item),
        split.slots / heads_per_item,
    )
}

/// Splits every sequence's rows into blocks of its part's slots (`parts[part_of[seq]]`: each
/// part runs in its own pass) and their keys into chunks: the smallest chunk (whole granules
/// of every part, at most the smallest `max_chunk`) whose items still number at most
/// `target`, so short batches fill the device and long ones are not split further than they
/// must. A function of its inputs only.
pub(super) fn work_list(
    parts: &[Split],
    part_of: &[usize],
    inputs: &PlanInputs,
    tokens: &[usize],
    q_rows: &[usize],
    target: usize,
) -> WorkList {
    let (h, h_kv) = (inputs.num_qo_heads, inputs.num_kv_heads);
    let group = h / h_kv;
    let o = &inputs.options;
    let mut blocks = Vec::new();
    for (seq, (&kv_len, &q_len)) in tokens.iter().zip(q_rows).enumerate() {
        let part = part_of[seq];
        let (_, _, rows_per_item) = head_blocks(parts[part], group);
        for row0 in (0..q_len).step_by(rows_per_item) {
            let rows = rows_per_item.min(q_len - row0);
            // Positions exist only where rows are a sequence's last tokens (checked: q_len ≤
            // kv_len whenever causal, a window or ALiBi reads them).
            let first_pos = (kv_len + row0).saturating_sub(q_len);
            let last_pos = first_pos + rows - 1;
            let hi = if o.causal { last_pos + 1 } else { kv_len };
            let lo = o.window_left.map_or(0, |w| first_pos.saturating_sub(w));
            blocks.push(RowBlock {
                part,
                seq,
                row0,
                rows,
                keys: (lo, hi.max(lo)),
            });
        }
    }
    let used: Vec<Split> = (0..parts.len())
        .filter(|p| part_of.contains(p))
        .map(|p| parts[p])
        .collect();
    // Granules are powers of two: the largest is a multiple of every other.
    let tile = used.iter().map(|s| s.granule).max().unwrap_or(1);
    let max_chunk = used.iter().map(|s| s.max_chunk).min().unwrap_or(tile);
    let max_chunk = (max_chunk / tile * tile).max(tile);
    let items_at = |chunk: usize| -> usize {
        blocks
            .iter()
            .map(|b| {
                let per_block = h_kv * head_blocks(parts[b.part], group).1;
                (b.keys.1 - b.keys.0).div_ceil(chunk).max(1) * per_block
            })
            .sum()
    };
    // Chunks below this many keys cost more in partial states than they win.
    let min_chunk = (8 * tile).min(max_chunk);
    let chunk_keys = if items_at(max_chunk) >= target {
        max_chunk
    } else {
        // Smallest whole-tile chunk in [min_chunk, max_chunk] with items ≤ target.
        let (mut lo, mut hi) = (min_chunk / tile, max_chunk / tile);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if items_at(mid * tile) <= target {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo * tile
    };

    let mut w = WorkList {
        items: vec![Vec::new(); parts.len()],
        seqs: Vec::new(),
        rows: vec![0; 4 * q_rows.iter().sum::<usize>()],
        partial_rows: 0,
        chunk_keys,
    };
    let mut q_begin = 0;
    for (&kv_len, &q_len) in tokens.iter().zip(q_rows) {
        w.seqs
            .extend([q_begin as u32, q_len as u32, kv_len as u32, 0]);
        q_begin += q_len;
    }
    // Each sequence's first page in kv_indices.
    for s in 0..tokens.len() {
        w.seqs[s * SEQ_WORDS + 3] = inputs.table.kv_indptr[s];
    }
    for b in &blocks {
        let span = b.keys.1 - b.keys.0;
        let chunks = span.div_ceil(chunk_keys).max(1);
        let partial_base = w.partial_rows;
        if chunks > 1 {
            w.partial_rows += chunks * b.rows;
        }
        let q_begin = w.seqs[b.seq * SEQ_WORDS] as usize;
        for i in 0..b.rows {
            let at = 4 * (q_begin + b.row0 + i);
            w.rows[at..at + 4].copy_from_slice(&[
                (partial_base + i) as u32,
                b.rows as u32,
                chunks as u32,
                0,
            ]);
        }
        for c in 0..chunks {
            let begin = b.keys.0 + c * chunk_keys;
            let end = (begin + chunk_keys).min(b.keys.1);
            let partial = if chunks > 1 {
                (partial_base + c * b.rows) as u32
            } else {
                DIRECT
            };
            let (heads_per_item, blocks_per_group, _) = head_blocks(parts[b.part], group);
            for kvh in 0..h_kv {
                for hb in 0..blocks_per_group {
                    let head0 = hb * heads_per_item;
                    let n_heads = heads_per_item.min(group - head0);
                    w.items[b.part].extend([
                        b.seq as u32,
                        kvh as u32,
                        head0 as u32,
                        n_heads as u32,
                        b.row0 as u32,
                        b.rows as u32,
                        begin as u32,
                        end as u32,
                        partial,
                        (c == 0) as u32,
                        0,
                        0,
                    ]);
                }
            }
        }
    }
    for (items, split) in w.items.iter_mut().zip(parts) {
        debug_assert_eq!(items.len() % ITEM_WORDS, 0);
        *items = spread_cost(items, (split.slots / 2).max(1) as u64);
    }
    w
}

/// Keys an item's fixed work is worth (its q loads, the lanes' combine and writes), in the
/// cost that orders the list.
const ITEM_OVERHEAD_KEYS: u64 = 32;

/// The items reordered so that every stretch of the list costs about its share: a software
/// adapter (llvmpipe) hands each of its threads an equal, contiguous range of workgroups, so a
/// long sequence's items listed together would all land on one thread (measured: a decode
/// step of 15 × 256 + 1 × 8,192 keys took 1.5× as long as 16 × 752). Largest first whenever
/// the running cost is behind the mean, smallest otherwise; ties keep the list's order, so the
/// order is a function of the plan's inputs. A GPU's scheduler takes workgroups as they free
/// up, where starting with the largest does no harm. An item's cost: its keys times its
/// (row, head) slots, but at least `slot_floor` of them — staging a key costs a tiled body as
/// much for one slot as for all.
fn spread_cost(items: &[u32], slot_floor: u64) -> Vec<u32> {
    let cost = |i: usize| -> u64 {
        let w = &items[i * ITEM_WORDS..];
        let keys = u64::from(w[7].saturating_sub(w[6]));
        let slots = u64::from(w[3]) * u64::from(w[5]);
        (keys + ITEM_OVERHEAD_KEYS) * slots.max(slot_floor)
    };
    let n = items.len() / ITEM_WORDS;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(i)));
    let total: u64 = (0..n).map(cost).sum();
    let (mut big, mut small) = (0, n);
    let mut spent = 0u64;
    let mut out = Vec::with_capacity(items.len());
    for placed in 0..n as u64 {
        // Behind the line placed · mean (compared multiplied through by n): the largest left.
        let i = if spent * n as u64 <= placed * total {
            big += 1;
            order[big - 1]
        } else {
            small -= 1;
            order[small]
        };
        spent += cost(i);
        out.extend_from_slice(&items[i * ITEM_WORDS..(i + 1) * ITEM_WORDS]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items of `keys` each (one row, one head), as the work list writes them.
    fn items(keys: &[u32]) -> Vec<u32> {
        keys.iter()
            .enumerate()
            .flat_map(|(i, &k)| [i as u32, 0, 0, 1, 0, 1, 0, k, DIRECT, 1, 0, 0])
            .collect()
    }

    #[test]
    fn every_stretch_of_the_spread_list_costs_its_share() {
        // A long sequence's chunks after many short sequences, as work_list lists them.
        let mut keys = vec![256; 120];
        keys.extend([910; 72]);
        let spread = spread_cost(&items(&keys), 1);
        let got: Vec<u32> = spread.chunks(ITEM_WORDS).map(|w| w[7]).collect();
        // The same items, each once.
        let mut ids: Vec<u32> = spread.chunks(ITEM_WORDS).map(|w| w[0]).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..keys.len() as u32).collect::<Vec<_>>());
        let cost = |k: u32| u64::from(k) + ITEM_OVERHEAD_KEYS;
        let total: u64 = got.iter().map(|&k| cost(k)).sum();
        let most = cost(910);
        for threads in [2usize, 3, 4, 8, 16] {
            let per = got.len().div_ceil(threads);
            for part in got.chunks(per) {
                let share = total * part.len() as u64 / got.len() as u64;
                let spent: u64 = part.iter().map(|&k| cost(k)).sum();
                assert!(
                    spent.abs_diff(share) <= 2 * most,
                    "{threads} threads: a range costs {spent}, its share {share}"
                );
            }
        }
        // Before spreading, two threads' halves differed by 2.9x.
        let half: u64 = keys[..96].iter().map(|&k| cost(k)).sum();
        assert!(total - half > 2 * half);
    }
}
