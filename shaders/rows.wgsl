// Where the rows of a Q, K, V or output tensor lie in its buffer (mirrors `RowStrides` in
// src/kernels/mod.rs): row l of head h of batch b starts at element
// offset + b·batch + h·head + l·row, and its elements are contiguous. The module's head-split
// [B, H, L, d] buffers, a caller's [B, L, H, d] projections and a KV cache slab with spare rows
// are all such layouts, so one kernel reads each without a copy. The host prepends this file.
struct RowStrides {
    offset: u32,
    batch: u32,
    head: u32,
    row: u32,
}

fn row_start(r: RowStrides, b: u32, h: u32, l: u32) -> u32 {
    return r.offset + b * r.batch + h * r.head + l * r.row;
}
