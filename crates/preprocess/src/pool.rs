//! A fixed set of threads that tokenize, so the tokenizer's per-thread caches exist a known
//! number of times.
//!
//! The fast encoder (`fastokens`) keeps caches per thread that calls it: a pretoken table
//! that doubles as new words come, up to 64 MiB, and an arena of long pretokens up to
//! 32 MiB. Called on an async runtime's threads (one per core) and on its blocking threads
//! (up to hundreds), those caches would take up to ~100 MiB per core and more. Handed to
//! this pool instead, they exist once per pool thread, and stay warm since every prompt
//! passes through the same few threads.
//!
//! Jobs waiting for a thread are bounded: past the bound, [`TokenizePool::run`] refuses
//! at once with [`PreprocessError::Busy`] (the servers answer 503). A job whose caller has
//! gone (a client that hung up while its prompt waited) is skipped. A panic inside a job
//! comes back to its caller as an error; the thread lives on.

use crate::PreprocessError;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Threads that tokenize, unless set otherwise: two, whatever the machine (one tokenizes
/// a short chat in about 5 µs and a new 2,000-word prompt in about 50 µs, and texts of
/// 64 KiB or more are spread over the tokenizer library's own threads).
pub const DEFAULT_THREADS: usize = 2;

/// Jobs that may wait for a tokenizing thread, unless set otherwise.
pub const DEFAULT_QUEUE: usize = 4096;

/// The pool; cheap to clone (clones share the threads).
#[derive(Clone)]
pub struct TokenizePool {
    inner: Arc<Inner>,
}

struct Inner {
    threads: rayon_core::ThreadPool,
    count: usize,
    /// Jobs handed over and not yet finished.
    pending: AtomicUsize,
    /// Most jobs handed over and not yet finished.
    queue: usize,
}

/// Takes a job's slot back when the job ends, however it ends.
struct Slot(Arc<Inner>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for TokenizePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizePool")
            .field("threads", &self.inner.count)
            .field("queue", &self.inner.queue)
            .field("pending", &self.pending())
            .finish()
    }
}

impl TokenizePool {
    /// Starts `threads` threads (named `kvroute-tokenize-N`) taking at most `queue` jobs at
    /// once. Errors when either is 0 or the threads cannot be started.
    pub fn new(threads: usize, queue: usize) -> Result<Self, PreprocessError> {
        if threads == 0 || queue == 0 {
            return Err(PreprocessError::Config(format!(
                "a tokenizing pool needs at least one thread and one queue slot \
                 (got {threads} threads, queue {queue})"
            )));
        }
        let pool = rayon_core::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kvroute-tokenize-{i}"))
            .build()
            .map_err(|e| PreprocessError::Config(format!("starting tokenizing threads: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                threads: pool,
                count: threads,
                pending: AtomicUsize::new(0),
                queue,
            }),
        })
    }

    /// Its threads.
    pub fn threads(&self) -> usize {
        self.inner.count
    }

    /// Jobs handed over and not finished yet.
    pub fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::Acquire)
    }

    /// Runs `job` on a pool thread and waits for it without blocking the caller's thread.
    /// [`PreprocessError::Busy`] at once when `queue` jobs are already waiting or running.
    pub async fn run<T, F>(&self, job: F) -> Result<T, PreprocessError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, PreprocessError> + Send + 'static,
    {
        let slot = self.take_slot()?;
        let (tx, rx) = futures_channel::oneshot::channel();
        self.inner.threads.spawn(move || {
            if tx.is_canceled() {
                return;
            }
            let out = catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(PreprocessError::Encode(format!(
                    "the tokenizer panicked: {why}"
                )))
            });
            // The slot is free before the caller hears back, so it can hand over again.
            drop(slot);
            let _ = tx.send(out);
        });
        rx.await
            .map_err(|_| PreprocessError::Encode("the tokenizing thread dropped the job".into()))?
    }

    fn take_slot(&self) -> Result<Slot, PreprocessError> {
        let queue = self.inner.queue;
        self.inner
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < queue).then_some(n + 1)
            })
            .map_err(|_| PreprocessError::Busy { queue })?;
        Ok(Slot(self.inner.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::sync::mpsc;
    use std::time::Duration;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn jobs_run_on_the_pools_named_threads() {
        let pool = TokenizePool::new(2, 8).unwrap();
        let name = block_on(pool.run(|| Ok(std::thread::current().name().map(str::to_owned))))
            .unwrap()
            .unwrap();
        assert!(name.starts_with("kvroute-tokenize-"), "{name}");
        assert_eq!(pool.pending(), 0);
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_frees_its_slots_after() {
        let pool = TokenizePool::new(1, 2).unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let mut held = Vec::new();
        for _ in 0..2 {
            let (rx, started) = (release_rx.clone(), started_tx.clone());
            let p = pool.clone();
            held.push(std::thread::spawn(move || {
                block_on(p.run(move || {
                    let _ = started.send(());
                    let _ = rx.lock().unwrap().recv();
                    Ok(1)
                }))
            }));
        }
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        // Both slots are taken (one job running, one waiting for the only thread).
        while pool.pending() < 2 {
            std::thread::yield_now();
        }
        let refused = block_on(pool.run(|| Ok(0)));
        assert!(
            matches!(refused, Err(PreprocessError::Busy { queue: 2 })),
            "{refused:?}"
        );
        release_tx.send(()).unwrap();
        release_tx.send(()).unwrap();
        for h in held {
            assert_eq!(h.join().unwrap().unwrap(), 1);
        }
        assert_eq!(pool.pending(), 0);
        assert_eq!(block_on(pool.run(|| Ok(3))).unwrap(), 3);
    }

    #[test]
    fn a_panicking_job_is_an_error_and_the_pool_lives_on() {
        let pool = TokenizePool::new(1, 4).unwrap();
        let err = block_on(pool.run(|| -> Result<u8, _> { panic!("boom") })).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(block_on(pool.run(|| Ok(7))).unwrap(), 7);
        assert_eq!(pool.pending(), 0);
    }

    #[test]
    fn a_job_whose_caller_is_gone_is_skipped() {
        let pool = TokenizePool::new(1, 4).unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let blocker = {
            let p = pool.clone();
            std::thread::spawn(move || {
                block_on(p.run(move || {
                    let _ = started_tx.send(());
                    let _ = release_rx.recv();
                    Ok(())
                }))
            })
        };
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        {
            let ran = ran.clone();
            let fut = pool.run(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            });
            // Polled once (the job is handed over), then dropped: the caller gave up.
            let mut fut = Box::pin(fut);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
        release_tx.send(()).unwrap();
        blocker.join().unwrap().unwrap();
        while pool.pending() > 0 {
            std::thread::yield_now();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn zero_threads_or_queue_is_a_config_error() {
        assert!(TokenizePool::new(0, 1).is_err());
        assert!(TokenizePool::new(1, 0).is_err());
    }
}
