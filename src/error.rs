//! The one error type of the crate. Every variant carries the values that explain it, so a
//! message alone tells the user what to fix.

/// Everything that can go wrong in wgpu-mha.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No adapter matched (or none exists at all).
    #[error(
        "no GPU adapter found{detail}: install a GPU driver, or a software Vulkan device \
         (`apt-get install mesa-vulkan-drivers` gives lavapipe); WGPU_BACKEND=gl selects Mesa's GL"
    )]
    NoAdapter {
        /// What was looked for (a backend, a name and the adapters found), as text appended to
        /// the message; empty when nothing was asked.
        detail: String,
    },

    /// The adapter was found but refused to open a device.
    #[error("could not open a device on `{adapter}`: {message}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's reason, in words.
        message: String,
    },

    /// A configuration number is impossible (zero heads, d_model not divisible, ...).
    #[error("invalid attention config: {0}")]
    Config(String),

    /// A call that cannot work as made: an option that contradicts another (the fused path with
    /// probabilities), a KV cache used with another module, a buffer without the usage it
    /// needs, an unknown backend or benchmark spec.
    #[error("invalid use: {0}")]
    Misuse(String),

    /// An input tensor has the wrong shape.
    #[error("{what} has shape {got:?}, expected {expected}")]
    Shape {
        /// Which tensor.
        what: String,
        /// The shape it should have, in words (e.g. `[batch, Lq, 64]`).
        expected: String,
        /// The shape it has.
        got: Vec<usize>,
    },

    /// A tensor's data length does not match its shape.
    #[error("{what}: shape {shape:?} needs {expected} values, got {got}")]
    DataLength {
        /// Which tensor.
        what: String,
        /// The shape given.
        shape: Vec<usize>,
        /// How many values the shape needs (the product of its dimensions).
        expected: usize,
        /// How many values the data holds.
        got: usize,
    },

    /// A mask cannot be applied to this problem.
    #[error("invalid mask: {0}")]
    Mask(String),

    /// A weight is missing, mis-shaped or of an unreadable dtype.
    #[error("weight `{name}`: {problem}")]
    Weight {
        /// The weight's name (e.g. a tensor name in the checkpoint).
        name: String,
        /// What is wrong with it, in words.
        problem: String,
    },

    /// A safetensors file (weights or case file) could not be read.
    #[error("{source_name}: {problem}")]
    File {
        /// The file's name as used in messages (its path when opened from disk).
        source_name: String,
        /// What is wrong with it, in words.
        problem: String,
    },

    /// A checkpoint's attention module needs something the engine does not run yet (RoPE, a
    /// sliding window, …): named, never run as another problem.
    #[error("{module}: {what} is not supported yet ({why})")]
    UnsupportedModule {
        /// Which module (its kind and name), in words.
        module: String,
        /// The part of it that is not supported.
        what: String,
        /// Why, in words.
        why: String,
    },

    /// A feature the call needs is missing on this adapter (e.g. f16 on GL).
    #[error("unsupported on adapter `{adapter}`: {what}")]
    Unsupported {
        /// The adapter's name.
        adapter: String,
        /// What the call needs that the adapter lacks, in words.
        what: String,
    },

    /// The problem does not fit the device even after splitting.
    #[error("{what} needs {needed} bytes, but this device allows at most {limit} bytes")]
    TooLarge {
        /// What does not fit (a buffer, a binding, ...), in words.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// The most bytes the device allows for it.
        limit: u64,
    },

    /// A KV cache step would grow the cache past its capacity; the cache is unchanged.
    #[error(
        "KV cache is full: {len} cached + {new} new tokens > capacity {capacity}; \
         reset() it or make a larger cache"
    )]
    KvCacheFull {
        /// Tokens already in the cache.
        len: usize,
        /// Tokens the step would add.
        new: usize,
        /// The most tokens the cache holds.
        capacity: usize,
    },

    /// A page table or query index of a paged batch is wrong (see `serve::PageTable::check`).
    #[error("invalid page table: {0}")]
    PageTable(String),

    /// A page pool has too few free pages for what was asked; nothing was allocated or written.
    #[error(
        "page pool exhausted: {asked} pages asked, {free} free of the pool's {max_pages}; free \
         finished sequences or make a larger pool"
    )]
    PagesExhausted {
        /// Pages the call needed.
        asked: usize,
        /// Pages free in the pool.
        free: usize,
        /// All pages of the pool.
        max_pages: usize,
    },

    /// wgpu reported a validation or out-of-memory error; nothing was returned.
    #[error("GPU error during {stage}: {message}")]
    Gpu {
        /// What the crate was doing when it happened, in words.
        stage: String,
        /// wgpu's message.
        message: String,
    },

    /// The device was lost; build a new `Gpu` (and module) to continue.
    #[error("GPU device lost: {0}")]
    DeviceLost(String),

    /// I/O error reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// The file's path, as displayed.
        path: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The crate's `Result`: `Err` is [`Error`] unless another is named.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn shape(
        what: impl Into<String>,
        expected: impl Into<String>,
        got: &[usize],
    ) -> Self {
        Error::Shape {
            what: what.into(),
            expected: expected.into(),
            got: got.to_vec(),
        }
    }
    pub(crate) fn weight(name: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::Weight {
            name: name.into(),
            problem: problem.into(),
        }
    }
    pub(crate) fn file(source_name: impl Into<String>, problem: impl Into<String>) -> Self {
        Error::File {
            source_name: source_name.into(),
            problem: problem.into(),
        }
    }
}
