//! A note on stderr when a command is still busy after a while, so that a first use of new
//! head sizes on a software adapter (shader compiles of minutes, cached by the driver for
//! later runs) does not look like a hang.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// How long a command runs before the note is printed.
const QUIET_FOR: Duration = Duration::from_secs(10);

/// Prints the note once unless dropped within [`QUIET_FOR`].
pub struct SlowNote {
    done: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SlowNote {
    pub fn start(what: &'static str) -> Self {
        let (done, wait) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(QUIET_FOR) {
                eprintln!(
                    "note: {what} is still running after {} s; the first use of new head sizes \
                     compiles shaders, which can take minutes on a software adapter (the driver \
                     caches them for later runs)",
                    QUIET_FOR.as_secs()
                );
            }
        });
        SlowNote {
            done: Some(done),
            thread: Some(thread),
        }
    }
}

impl Drop for SlowNote {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread with `Disconnected` (no note).
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
