//! Error scopes in the browser. WebGPU answers a popped scope with a promise, and nothing may
//! block on the web (there is no second thread to resolve it), so [`Gpu::scoped`](super::Gpu)
//! cannot wait there as it does natively. It keeps the popped scopes here instead, and the next
//! read ([`GpuTensor::read_async`](crate::GpuTensor::read_async)) awaits them all before it
//! hands back data: an error of a forward becomes that read's `Err`, naming the forward's stage.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::error::{Error, Result};

type ScopeFuture = Pin<Box<dyn Future<Output = Option<wgpu::Error>>>>;

/// Scopes popped but not yet looked at, each with the stage it covered. Shared by a `Gpu`'s
/// clones.
#[derive(Clone, Default)]
pub(crate) struct DeferredScopes(Arc<Mutex<Vec<(String, ScopeFuture)>>>);

impl fmt::Debug for DeferredScopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pending = self.0.lock().map_or(0, |v| v.len());
        write!(f, "DeferredScopes({pending} pending)")
    }
}

impl DeferredScopes {
    /// Keeps a popped scope (validation, then out-of-memory) of `stage` for the next read.
    pub(crate) fn push(&self, stage: &str, validation: ScopeFuture, oom: ScopeFuture) {
        let both: ScopeFuture = Box::pin(async move {
            match validation.await {
                Some(e) => Some(e),
                None => oom.await,
            }
        });
        if let Ok(mut v) = self.0.lock() {
            v.push((stage.to_string(), both));
        }
    }

    /// Every scope kept so far, as one future: `Ok` once all came back empty, else the first
    /// error (in the order the stages ran).
    pub(crate) fn take(&self) -> ScopeResults {
        let pending = self
            .0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        ScopeResults { pending }
    }
}

/// The future of [`DeferredScopes::take`].
pub(crate) struct ScopeResults {
    pending: Vec<(String, ScopeFuture)>,
}

impl Future for ScopeResults {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        while let Some((stage, scope)) = self.pending.first_mut() {
            match scope.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(e)) => {
                    return Poll::Ready(Err(Error::Gpu {
                        stage: stage.clone(),
                        message: e.to_string(),
                    }))
                }
                Poll::Ready(None) => {
                    let _answered = self.pending.remove(0);
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}
