//! A bounded queue to a worker thread (the decoder, the painter): handlers submit, the
//! thread takes, and a submission past `max` waiting is refused at once (the handler
//! answers 503) rather than waiting.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

/// The queue is full: the caller answers 503.
#[derive(Debug)]
pub struct Busy;

/// The handlers' side.
pub struct Queue<T> {
    jobs: mpsc::SyncSender<T>,
    queued: Arc<AtomicUsize>,
    max: usize,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue { jobs: self.jobs.clone(), queued: self.queued.clone(), max: self.max }
    }
}

/// The worker's side.
pub struct Inbox<T> {
    jobs: mpsc::Receiver<T>,
    queued: Arc<AtomicUsize>,
}

/// A queue holding at most `max` (at least 1) waiting jobs.
pub fn bounded<T>(max: usize) -> (Queue<T>, Inbox<T>) {
    let max = max.max(1);
    let (jobs, inbox) = mpsc::sync_channel(max);
    let queued = Arc::new(AtomicUsize::new(0));
    (Queue { jobs, queued: queued.clone(), max }, Inbox { jobs: inbox, queued })
}

impl<T> Queue<T> {
    /// Queues `job`, or refuses it when `max` jobs already wait.
    pub fn submit(&self, job: T) -> Result<(), Busy> {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= self.max {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy);
        }
        self.jobs.try_send(job).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            Busy
        })
    }

    /// Jobs waiting to be taken.
    pub fn waiting(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }
}

impl<T> Inbox<T> {
    /// The next job, waiting for one; `None` once every handler's side is gone.
    pub fn recv(&self) -> Option<T> {
        let job = self.jobs.recv().ok()?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(job)
    }

    /// The next job if one waits.
    pub fn try_recv(&self) -> Option<T> {
        let job = self.jobs.try_recv().ok()?;
        self.queued.fetch_sub(1, Ordering::SeqCst);
        Some(job)
    }
}
