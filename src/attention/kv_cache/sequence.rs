//! The cache's sequence rule, checked: every step is numbered when it is recorded, and the
//! encoder it was recorded into carries a ticket (`CommandEncoder::on_submitted_work_done`).
//! wgpu runs that callback when the submitted command buffer has run on the GPU, and drops
//! it unrun when the encoder (or its command buffer) is dropped unsubmitted. So the host
//! learns, without waiting and without touching the GPU:
//!
//! * **a dropped step**: its ticket dropped unrun — its rows were never written, and every
//!   later step reads them;
//! * **an out-of-order step**: its ticket ran while an earlier-numbered step was still
//!   pending — wgpu runs these callbacks in submission order, so the later step's encoder
//!   was submitted first and read rows not yet written.
//!
//! The next step of the cache (any form) is then an `Err` naming the rule and the length to
//! [`KvCache::truncate`](super::KvCache::truncate) to, until the cache is rolled back past the
//! broken step. A host step, which waits for its own result, finds its own fault at once.
//! Cost: one small closure per step, and a non-blocking `device.poll` before each step.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// What went wrong, with the tokens a rollback must undo.
#[derive(Debug, Clone)]
enum Fault {
    Dropped {
        step: u64,
        tokens: Range<usize>,
    },
    OutOfOrder {
        step: u64,
        tokens: Range<usize>,
        earlier: u64,
        earlier_tokens: Range<usize>,
    },
}

impl Fault {
    /// The length the cache must be truncated to (at most) to undo the fault.
    fn rollback(&self) -> usize {
        match self {
            Fault::Dropped { tokens, .. } => tokens.start,
            Fault::OutOfOrder { earlier_tokens, .. } => earlier_tokens.start,
        }
    }

    fn error(&self) -> Error {
        let to = self.rollback();
        Error::Misuse(match self {
            Fault::Dropped { step, tokens } => format!(
                "KV cache sequence rule: step #{step} (tokens {tokens:?}) was recorded into an \
                 encoder that was dropped without being submitted, so its rows were never written \
                 and later steps would read them; roll the cache back with truncate({to}) (or \
                 reset()) and step again"
            ),
            Fault::OutOfOrder {
                step,
                tokens,
                earlier,
                earlier_tokens,
            } => format!(
                "KV cache sequence rule: step #{step} (tokens {tokens:?}) ran on the GPU before \
                 step #{earlier} (tokens {earlier_tokens:?}), which was recorded earlier: submit \
                 the encoders holding a cache's steps in the order they were recorded. Step \
                 #{step}'s output is wrong; roll the cache back with truncate({to}) and step again"
            ),
        })
    }
}

#[derive(Debug, Default)]
struct State {
    /// The number the next recorded step gets.
    next: u64,
    /// Recorded steps whose command buffer has neither run nor been dropped: number → tokens.
    pending: BTreeMap<u64, Range<usize>>,
    /// The earliest fault seen (by the tokens it breaks), until a rollback undoes it.
    fault: Option<Fault>,
}

impl State {
    fn note(&mut self, fault: Fault) {
        match &self.fault {
            Some(f) if f.rollback() <= fault.rollback() => {}
            _ => self.fault = Some(fault),
        }
    }

    /// Step `step`'s command buffer ran (`true`) or was dropped unsubmitted.
    fn settle(&mut self, step: u64, ran: bool) {
        // A step rolled back by `truncate` is no longer tracked.
        let Some(tokens) = self.pending.remove(&step) else {
            return;
        };
        if !ran {
            self.note(Fault::Dropped { step, tokens });
        } else if let Some((&earlier, earlier_tokens)) = self.pending.range(..step).next() {
            let earlier_tokens = earlier_tokens.clone();
            self.note(Fault::OutOfOrder {
                step,
                tokens,
                earlier,
                earlier_tokens,
            });
        }
    }
}

/// The steps of one cache, as recorded and as the GPU ran them.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    state: Arc<Mutex<State>>,
}

/// Moved into a step's work-done callback: run, it settles the step as run; dropped unrun
/// (the encoder was dropped), as dropped.
struct Ticket {
    state: Arc<Mutex<State>>,
    step: u64,
    ran: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut state) = self.state.lock() {
            state.settle(self.step, self.ran);
        }
    }
}

impl Ledger {
    /// Numbers a step of `tokens` just recorded into `encoder` and tracks its command buffer.
    pub fn track(&self, encoder: &wgpu::CommandEncoder, tokens: Range<usize>) {
        let step = match self.state.lock() {
            Ok(mut state) => {
                state.next += 1;
                let step = state.next;
                state.pending.insert(step, tokens);
                step
            }
            Err(_) => return,
        };
        let mut ticket = Ticket {
            state: self.state.clone(),
            step,
            ran: false,
        };
        encoder.on_submitted_work_done(move || {
            ticket.ran = true;
            drop(ticket);
        });
    }

    /// `Err` naming the rule and the rollback while a fault stands.
    pub fn check(&self) -> Result<()> {
        match self.state.lock() {
            Ok(state) => state.fault.as_ref().map_or(Ok(()), |f| Err(f.error())),
            Err(_) => Err(Error::Misuse(
                "KV cache sequence rule: the cache's step ledger was poisoned by a panic".into(),
            )),
        }
    }

    /// The cache now holds `len` tokens: steps that wrote past them are forgotten, and a
    /// fault they caused is cleared.
    pub fn truncate(&self, len: usize) {
        if let Ok(mut state) = self.state.lock() {
            state.pending.retain(|_, tokens| tokens.start < len);
            if state.fault.as_ref().is_some_and(|f| f.rollback() >= len) {
                state.fault = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(state: &mut State, tokens: Range<usize>) -> u64 {
        state.next += 1;
        state.pending.insert(state.next, tokens);
        state.next
    }

    #[test]
    fn in_order_steps_leave_no_fault() {
        let mut s = State::default();
        let a = tracked(&mut s, 0..3);
        let b = tracked(&mut s, 3..4);
        s.settle(a, true);
        s.settle(b, true);
        assert!(s.fault.is_none() && s.pending.is_empty());
    }

    #[test]
    fn a_dropped_or_overtaken_step_is_a_fault_until_rolled_back() {
        let mut s = State::default();
        let a = tracked(&mut s, 0..3);
        let b = tracked(&mut s, 3..4);
        s.settle(b, true);
        assert_eq!(s.fault.as_ref().map(Fault::rollback), Some(0));
        s.settle(a, false);
        assert_eq!(s.fault.as_ref().map(Fault::rollback), Some(0));
        let ledger = Ledger {
            state: Arc::new(Mutex::new(s)),
        };
        assert!(ledger.check().is_err());
        ledger.truncate(1);
        assert!(ledger.check().is_err(), "not rolled back far enough");
        ledger.truncate(0);
        assert!(ledger.check().is_ok());
    }
}
