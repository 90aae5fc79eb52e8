//! The primitives the pieces are written over. Normally std's and tokio's; under `--cfg loom`,
//! loom's, plus small models built from loom's primitives for the std and tokio types loom lacks
//! (or models without the semantics relied on here: loom's own `mpsc` never disconnects). Each
//! model keeps exactly the semantics the pieces rely on, as stated on it.

use std::sync::{LockResult, PoisonError};

/// Locks, ignoring poisoning: every critical section here leaves its map consistent at each
/// step, and a guard's `Drop` must not panic while a panic unwinds.
pub(crate) fn lock<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(PoisonError::into_inner)
}

#[cfg(not(loom))]
mod imp {
    pub(crate) use std::sync::{Arc, Mutex};
    pub use tokio::sync::Notify;

    /// The per-key lock of [`KeyedLocks`](crate::KeyedLocks).
    pub(crate) type AsyncMutex = tokio::sync::Mutex<()>;
    pub(crate) type OwnedGuard = tokio::sync::OwnedMutexGuard<()>;

    pub(crate) fn lock_owned(lock: Arc<AsyncMutex>) -> impl std::future::Future<Output = OwnedGuard> {
        lock.lock_owned()
    }

    /// The writer's job queue.
    pub mod mpsc {
        pub use std::sync::mpsc::{channel, Receiver, RecvError, SendError, Sender, TryRecvError};
    }

    /// Where a job's caller hears how it ended.
    pub mod oneshot {
        pub use tokio::sync::oneshot::{channel, error::RecvError, Receiver, Sender};
    }
}

#[cfg(loom)]
mod imp {
    use loom::sync::Condvar;
    pub(crate) use loom::sync::{Arc, Mutex};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    /// tokio's `Notify` as the pieces use it: `notify_waiters` completes every [`Notified`]
    /// made before the call (tokio counts the calls and each `Notified` remembers the count it
    /// was made at, enabled or not) and none made after; it stores no permit. `notify_one` is
    /// modelled as `notify_waiters`: what is checked here (a map entry lives exactly as long as
    /// its subscriptions) does not depend on how many a wake-up reaches.
    #[derive(Default)]
    pub struct Notify {
        calls: Mutex<u64>,
        changed: Condvar,
    }

    impl Notify {
        pub fn new() -> Self {
            Self::default()
        }

        pub fn notify_waiters(&self) {
            *super::lock(self.calls.lock()) += 1;
            self.changed.notify_all();
        }

        pub fn notify_one(&self) {
            self.notify_waiters();
        }

        pub fn notified(&self) -> Notified<'_> {
            Notified {
                notify: self,
                made_at: *super::lock(self.calls.lock()),
            }
        }
    }

    pub struct Notified<'a> {
        notify: &'a Notify,
        made_at: u64,
    }

    impl Notified<'_> {
        /// Whether a `notify_waiters` came after this was made.
        pub fn is_notified(&self) -> bool {
            *super::lock(self.notify.calls.lock()) != self.made_at
        }

        /// Blocks until a `notify_waiters` comes after this was made.
        pub fn wait(self) {
            let mut calls = super::lock(self.notify.calls.lock());
            while *calls == self.made_at {
                calls = super::lock(self.notify.changed.wait(calls));
            }
        }
    }

    /// tokio's `Mutex<()>` as `KeyedLocks` uses it: one holder at a time, a waiter parks (its
    /// future is pending) until a release, and dropping a waiting future just leaves. Not fair
    /// (tokio's is FIFO), which only admits more interleavings.
    #[derive(Default)]
    pub(crate) struct AsyncMutex {
        state: Mutex<LockState>,
    }

    #[derive(Default)]
    struct LockState {
        locked: bool,
        waiters: Vec<Waker>,
    }

    pub(crate) fn lock_owned(lock: Arc<AsyncMutex>) -> impl Future<Output = OwnedGuard> {
        std::future::poll_fn(move |cx| {
            let mut state = super::lock(lock.state.lock());
            if state.locked {
                state.waiters.push(cx.waker().clone());
                Poll::Pending
            } else {
                state.locked = true;
                Poll::Ready(OwnedGuard(lock.clone()))
            }
        })
    }

    pub(crate) struct OwnedGuard(Arc<AsyncMutex>);

    impl Drop for OwnedGuard {
        fn drop(&mut self) {
            let waiters = {
                let mut state = super::lock(self.0.state.lock());
                state.locked = false;
                std::mem::take(&mut state.waiters)
            };
            waiters.into_iter().for_each(Waker::wake);
        }
    }

    /// `std::sync::mpsc` as the writer uses it: FIFO; `recv` fails once every sender is gone
    /// and the queue is empty; `send` hands the message back once the receiver is gone; dropping
    /// the receiver drops what is queued.
    pub mod mpsc {
        use super::{Arc, Condvar, Mutex};
        use std::collections::VecDeque;
        pub use std::sync::mpsc::{RecvError, SendError, TryRecvError};

        struct Chan<T> {
            state: Mutex<State<T>>,
            ready: Condvar,
        }

        struct State<T> {
            queue: VecDeque<T>,
            senders: usize,
            receiver: bool,
        }

        pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
            let chan = Arc::new(Chan {
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    senders: 1,
                    receiver: true,
                }),
                ready: Condvar::new(),
            });
            (Sender(chan.clone()), Receiver(chan))
        }

        pub struct Sender<T>(Arc<Chan<T>>);

        impl<T> Sender<T> {
            pub fn send(&self, message: T) -> Result<(), SendError<T>> {
                let mut state = crate::shim::lock(self.0.state.lock());
                if !state.receiver {
                    return Err(SendError(message));
                }
                state.queue.push_back(message);
                drop(state);
                self.0.ready.notify_one();
                Ok(())
            }
        }

        impl<T> Clone for Sender<T> {
            fn clone(&self) -> Self {
                crate::shim::lock(self.0.state.lock()).senders += 1;
                Sender(self.0.clone())
            }
        }

        impl<T> Drop for Sender<T> {
            fn drop(&mut self) {
                let mut state = crate::shim::lock(self.0.state.lock());
                state.senders -= 1;
                let last = state.senders == 0;
                drop(state);
                if last {
                    self.0.ready.notify_all();
                }
            }
        }

        pub struct Receiver<T>(Arc<Chan<T>>);

        impl<T> Receiver<T> {
            pub fn recv(&self) -> Result<T, RecvError> {
                let mut state = crate::shim::lock(self.0.state.lock());
                loop {
                    if let Some(message) = state.queue.pop_front() {
                        return Ok(message);
                    }
                    if state.senders == 0 {
                        return Err(RecvError);
                    }
                    state = crate::shim::lock(self.0.ready.wait(state));
                }
            }

            pub fn try_recv(&self) -> Result<T, TryRecvError> {
                let mut state = crate::shim::lock(self.0.state.lock());
                match state.queue.pop_front() {
                    Some(message) => Ok(message),
                    None if state.senders == 0 => Err(TryRecvError::Disconnected),
                    None => Err(TryRecvError::Empty),
                }
            }
        }

        impl<T> Drop for Receiver<T> {
            fn drop(&mut self) {
                let queued = {
                    let mut state = crate::shim::lock(self.0.state.lock());
                    state.receiver = false;
                    std::mem::take(&mut state.queue)
                };
                // Outside the lock: dropping a message may run arbitrary code.
                drop(queued);
            }
        }
    }

    /// `tokio::sync::oneshot` as the writer uses it: the receiver (a future) gets the value, or
    /// an error once the sender is dropped unsent; `send` hands the value back once the
    /// receiver is gone.
    ///
    /// One liberty: loom cannot let other threads run while one unwinds (they all share one OS
    /// thread, so its panic would be theirs too), so a sender dropped by an unwinding thread is
    /// closed only at [`close_unwound`], which that thread calls once its panic is caught. An
    /// unwinding thread does nothing else another can see, so no interleaving is lost.
    pub mod oneshot {
        use super::{Arc, Context, Future, Mutex, Pin, Poll, Waker};
        use std::cell::RefCell;

        pub mod error {
            #[derive(Debug, PartialEq, Eq)]
            pub struct RecvError;
        }
        use error::RecvError;

        struct Slot<T> {
            value: Option<T>,
            sender: bool,
            receiver: bool,
            waker: Option<Waker>,
        }

        type Shared<T> = Arc<Mutex<Slot<T>>>;

        thread_local! {
            static UNWOUND: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
        }

        /// Closes the senders dropped while this thread unwound.
        pub fn close_unwound() {
            let closers = UNWOUND.with(|u| std::mem::take(&mut *u.borrow_mut()));
            closers.into_iter().for_each(|close| close());
        }

        pub fn channel<T: 'static>() -> (Sender<T>, Receiver<T>) {
            let slot = Arc::new(Mutex::new(Slot {
                value: None,
                sender: true,
                receiver: true,
                waker: None,
            }));
            (Sender(Some(slot.clone())), Receiver(slot))
        }

        pub struct Sender<T: 'static>(Option<Shared<T>>);

        impl<T: 'static> Sender<T> {
            pub fn send(self, value: T) -> Result<(), T> {
                let shared = self.0.as_ref().expect("a sender is closed only when dropped");
                let mut slot = crate::shim::lock(shared.lock());
                if !slot.receiver {
                    return Err(value);
                }
                slot.value = Some(value);
                Ok(()) // the receiver is woken by the drop that follows
            }
        }

        fn close<T>(shared: Shared<T>) {
            let waker = {
                let mut slot = crate::shim::lock(shared.lock());
                slot.sender = false;
                slot.waker.take()
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }

        impl<T: 'static> Drop for Sender<T> {
            fn drop(&mut self) {
                let Some(shared) = self.0.take() else { return };
                if std::thread::panicking() {
                    UNWOUND.with(|u| u.borrow_mut().push(Box::new(move || close(shared))));
                } else {
                    close(shared);
                }
            }
        }

        pub struct Receiver<T>(Shared<T>);

        impl<T> Future for Receiver<T> {
            type Output = Result<T, RecvError>;

            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
                let mut slot = crate::shim::lock(self.0.lock());
                if let Some(value) = slot.value.take() {
                    Poll::Ready(Ok(value))
                } else if !slot.sender {
                    Poll::Ready(Err(RecvError))
                } else {
                    slot.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        }

        impl<T> Drop for Receiver<T> {
            fn drop(&mut self) {
                let unread = {
                    let mut slot = crate::shim::lock(self.0.lock());
                    slot.receiver = false;
                    slot.value.take()
                };
                drop(unread);
            }
        }
    }
}

pub use imp::*;
